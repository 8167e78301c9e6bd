# SPDX-License-Identifier: Apache-2.0
"""``confidence``: the EAGLE-2/3 baseline, the root plus the gamma - 1 nodes of highest P(path)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specmoe.decoding.selection import PackedPool, greedy_packed
from specmoe.interfaces.selector import Selector
from specmoe.interfaces.tree import DraftTree

__all__ = ["ConfidenceSelector"]


class ConfidenceSelector(Selector):
    """Top gamma - 1 nodes by cumulative draft probability.

    A child's cumulative probability never exceeds its parent's, so the top set is ancestor-closed; ties are
    broken towards shallower nodes (then lower index), which keeps closure when probabilities are equal.
    """

    description = "EAGLE-2/3 baseline: highest cumulative draft probability"

    @dataclass
    class Config:
        pass

    def select(self, tree: DraftTree, budget: int, experts: torch.Tensor | None = None,
               buffer: torch.Tensor | None = None) -> torch.Tensor:
        # tiny depth/index penalty breaks exact ties towards the parent side
        n = tree.num_nodes
        tie = tree.depth.float() * 1e-9 + torch.arange(n, device=tree.tokens.device).float() * 1e-12
        key = (tree.path_logp.double() - tie.double()).cpu().numpy().reshape(-1)
        sel = greedy_packed(PackedPool.build(tree), budget, lambda idx, new: key[idx])
        return torch.from_numpy(sel).to(tree.tokens.device)
