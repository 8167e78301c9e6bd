# SPDX-License-Identifier: Apache-2.0
"""``global_cost``: the paper's Table 4 ablation, P(path) / (|path experts| + eps), with no buffer.

P(path) is the engine's calibrated node value by default (``calibrated: true``, as ``confidence`` and ``ecospec``
rank by); ``calibrated: false`` is the draft's raw path probability, as in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specmoe.decoding.bitsets import popcount_rows
from specmoe.decoding.selection import PackedPool, greedy_packed, whole_pool
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
        calibrated: bool = True
        """P(path) is the engine's calibrated node value (true) or the draft's raw path probability (false)."""

    @property
    def node_values(self) -> bool:
        return bool(self.config.calibrated)

    def select(self, tree: DraftTree, budget: int, experts: torch.Tensor | None = None,
               buffer: torch.Tensor | None = None) -> torch.Tensor:
        if experts is None:
            raise ValueError("global_cost needs predicted expert sets")
        whole = whole_pool(tree, budget)
        if whole is not None:
            return whole
        pool = PackedPool.build(tree, experts)
        cost = popcount_rows(pool.paths).reshape(-1).astype(np.float32)  # [B*N]
        prob = tree.rank_value.float() if self.config.calibrated else tree.path_prob
        score = prob.detach().cpu().numpy().reshape(-1) / (cost + np.float32(self.config.eps))
        pool.paths = None  # static score: no buffer
        sel = greedy_packed(pool, budget, lambda idx, new: score[idx])
        return torch.from_numpy(sel).to(tree.tokens.device)
