# SPDX-License-Identifier: Apache-2.0
"""Drafter interface: proposes an EAGLE-2/3 style candidate pool as a :class:`DraftTree`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from specmoe.interfaces.checks import check_begin, check_draft, checked_method
from specmoe.interfaces.plugin import Plugin
from specmoe.interfaces.tree import DraftTree

if TYPE_CHECKING:
    from specmoe.interfaces.target import Target

__all__ = ["Drafter", "Committed"]


@dataclass
class Committed:
    """Tokens committed to the output since the drafter was last called.

    Attributes:
        tokens: ``[B, M]`` int64; each row's last valid token is the next tree's root (not yet seen by the target).
        valid: ``[B, M]`` bool (rows commit different numbers of tokens).
        positions: ``[B, M]`` int64 absolute positions.
        features: ``[B, M, F]`` target hidden states (the drafter's ``feature_layers``) from processing the
            token *before* each token (zeros where there is none); ``None`` when the drafter asks for none.
        first: True on the first call of a generation (the prompt).
    """

    tokens: torch.Tensor
    valid: torch.Tensor
    positions: torch.Tensor
    features: torch.Tensor | None = None
    first: bool = False


class Drafter(Plugin, ABC):
    """Builds EAGLE-2/3 draft trees scored by own cumulative log-probs; ``begin`` / ``draft`` check arguments first."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        checked_method(cls, "begin", check_begin)
        checked_method(cls, "draft", check_draft)

    @property
    def feature_layers(self) -> list[int]:
        """Target ``hidden_states`` indices this drafter needs in :class:`Committed` (empty: none)."""
        return []

    @property
    def feature_size(self) -> int:
        """Width ``F`` of :attr:`DraftTree.features` this drafter attaches (0: none). Valid after :meth:`setup`."""
        return 0

    def teacher_features(self, tokens: torch.Tensor, valid: torch.Tensor, target_hidden: torch.Tensor | None,
                         depths: int = 1) -> list[torch.Tensor]:
        """The node features :meth:`draft` would attach, teacher-forced over whole sequences (no cache, no tree).

        Args:
            tokens, valid: ``[B, T]`` int64 right-padded sequences and their bool validity.
            target_hidden: ``[B, T, F_t]`` the target's :attr:`feature_layers` over ``tokens`` (``None``: none).
            depths: how many tree depths to produce.

        Returns:
            ``depths`` tensors ``[B, T, F]``: entry ``d - 1`` at ``t`` is the feature of a depth-``d`` node with
            token ``tokens[:, t]`` in the tree rooted at ``tokens[:, t - d]`` along the sequence (depth 1 is also
            the root's). Values at ``t <= d`` are unspecified.
        """
        raise NotImplementedError(f"drafter {type(self).__name__} computes no per-node features")

    @abstractmethod
    def setup(self, target: Target) -> None:
        """Bind to the target (load weights, check vocabularies). Called once."""

    @abstractmethod
    def begin(self, batch_size: int) -> Any:
        """Fresh per-generation state (own KV cache etc.) for ``batch_size`` rows."""

    @abstractmethod
    def draft(self, state: Any, committed: Committed, steps: int, top_k: int) -> DraftTree:
        """Absorb ``committed``; return the pool rooted at each row's last token: ``N = 1 + top_k + (steps - 1) *
        top_k**2`` nodes per row, ``features [B, N, feature_size]`` when :attr:`feature_size` > 0."""
