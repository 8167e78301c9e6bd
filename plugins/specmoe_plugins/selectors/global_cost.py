# SPDX-License-Identifier: Apache-2.0
"""``global_cost``: the paper's Table 4 ablation, P(path) / (|path experts| + eps), with no buffer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specmoe.decoding.selection import greedy_select, path_experts
from specmoe.interfaces.selector import Selector
from specmoe.interfaces.tree import DraftTree

__all__ = ["GlobalCostSelector"]


class GlobalCostSelector(Selector):
    """Static cost-aware score: every node pays for its whole path footprint, whatever is selected."""

    description = "ablation: P(path) / (|predicted path experts| + eps), no buffer"
    needs_experts = True

    @dataclass
    class Config:
        eps: float = 1.0e-6

    def select(self, tree: DraftTree, budget: int, experts: torch.Tensor | None = None,
               buffer: torch.Tensor | None = None) -> torch.Tensor:
        if experts is None:
            raise ValueError("global_cost needs predicted expert sets")
        cost = path_experts(tree, experts).sum(dim=-1).float()  # [B, N]
        score = tree.path_prob / (cost + self.config.eps)
        return greedy_select(tree, budget, lambda sel: score)
