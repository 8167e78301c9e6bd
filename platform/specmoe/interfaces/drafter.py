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
        tokens: ``[B, M]`` int64; the last valid token of each row is the next tree's root (the bonus token,
            not yet processed by the target).
        valid: ``[B, M]`` bool (rows commit different numbers of tokens).
        positions: ``[B, M]`` int64 absolute positions.
        features: ``[B, M, F]`` target hidden states (the drafter's ``feature_layers``) at the position
            *before* each token (``features[:, i]`` was produced by the target when it processed the token
            preceding ``tokens[:, i]``); zeros where there is no previous token. ``None`` when the drafter
            asked for no features.
        first: True on the first call of a generation (the prompt).
    """

    tokens: torch.Tensor
    valid: torch.Tensor
    positions: torch.Tensor
    features: torch.Tensor | None = None
    first: bool = False


class Drafter(Plugin, ABC):
    """Builds draft trees. Node scores are the drafter's own cumulative log-probabilities.

    The pool follows EAGLE-2/3: expand the ``top_k`` frontier by ``top_k`` children for ``steps`` levels and
    keep every candidate with its cumulative score (``top_k + (steps - 1) * top_k**2`` nodes + root).

    Every implementation's :meth:`begin` and :meth:`draft` check their arguments first (sizes >= 1, the
    :class:`Committed` tensors of one shape; :mod:`specmoe.interfaces.checks`).
    """

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
        """Width ``F`` of the per-node features this drafter attaches to its trees (:attr:`DraftTree.features`);
        0 when it attaches none (the default). Valid after :meth:`setup`."""
        return 0

    def teacher_features(self, tokens: torch.Tensor, valid: torch.Tensor, target_hidden: torch.Tensor | None,
                         depths: int = 1) -> list[torch.Tensor]:
        """The node features :meth:`draft` would attach, computed teacher-forced over whole sequences (training
        data of feature-based predictors; no cache, no tree).

        Args:
            tokens: ``[B, T]`` int64 right-padded sequences.
            valid: ``[B, T]`` bool.
            target_hidden: ``[B, T, F_t]`` the target's hidden states :attr:`feature_layers` at every position
                (its causal pass over ``tokens``); ``None`` when :attr:`feature_layers` is empty.
            depths: how many tree depths to produce.

        Returns:
            ``depths`` tensors ``[B, T, F]``: entry ``d - 1`` at position ``t`` is the feature of a depth-``d``
            node with token ``tokens[:, t]`` in a tree rooted at ``tokens[:, t - d]`` whose path is the
            sequence itself (depth 1 is also the root's feature: both were proposed by a step over committed
            tokens). Positions ``t <= d`` have no such tree (the first drafter step needs a token before its
            input): their values are unspecified and consumers ignore them.
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
        """Absorb ``committed`` into ``state`` and return the candidate pool rooted at each row's last token.

        Returns:
            A :class:`DraftTree` with ``N = 1 + top_k + (steps - 1) * top_k**2`` nodes per row, with
            ``features [B, N, feature_size]`` when :attr:`feature_size` > 0.
        """
