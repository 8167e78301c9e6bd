# SPDX-License-Identifier: Apache-2.0
"""Drafter interface: proposes an EAGLE-2/3 style candidate pool as a :class:`DraftTree`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from specmoe.interfaces.plugin import Plugin
from specmoe.interfaces.tree import DraftTree

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
    """

    @property
    def feature_layers(self) -> list[int]:
        """Target ``hidden_states`` indices this drafter needs in :class:`Committed` (empty: none)."""
        return []

    @abstractmethod
    def setup(self, target: Any) -> None:
        """Bind to the target (load weights, check vocabularies). Called once."""

    @abstractmethod
    def begin(self, batch_size: int) -> Any:
        """Fresh per-generation state (own KV cache etc.) for ``batch_size`` rows."""

    @abstractmethod
    def draft(self, state: Any, committed: Committed, steps: int, top_k: int) -> DraftTree:
        """Absorb ``committed`` into ``state`` and return the candidate pool rooted at each row's last token.

        Returns:
            A :class:`DraftTree` with ``N = 1 + top_k + (steps - 1) * top_k**2`` nodes per row.
        """
