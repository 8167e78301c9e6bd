# SPDX-License-Identifier: Apache-2.0
"""Selector interface: choose the gamma tree nodes (root included) to verify."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from specmoe.interfaces.plugin import Plugin
from specmoe.interfaces.tree import DraftTree

__all__ = ["Selector"]


class Selector(Plugin, ABC):
    """Picks an ancestor-closed subset of each row's draft tree that contains the root."""

    #: whether :meth:`select` needs predicted expert sets (the engine then runs the predictor)
    needs_experts: ClassVar[bool] = False

    @property
    def node_values(self) -> bool:
        """Whether :meth:`select` ranks by :attr:`DraftTree.value` (set and learned online by the engine)."""
        return False

    @abstractmethod
    def select(self, tree: DraftTree, budget: int, experts: torch.Tensor | None = None,
               buffer: torch.Tensor | None = None) -> torch.Tensor:
        """Choose nodes to verify: ``[B, N]`` bool, ancestor-closed, root selected, at most ``budget`` (gamma,
        root included) per row, no padding node.

        Args:
            tree: ``B`` candidate pools of ``N`` nodes.
            experts: ``[B, N, L, E]`` bool predicted expert sets of each node (if ``needs_experts``).
            buffer: ``[L, E]`` bool initial expert buffer B0 (experts already counted as loaded).
        """
