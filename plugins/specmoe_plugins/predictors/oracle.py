# SPDX-License-Identifier: Apache-2.0
"""``oracle``: the target's own router run on the whole draft tree (analysis only, paper Table 10).

It costs a full target pass over the tree, so its time is reported as T_pred and methods using it are marked
analysis-only: never a real speedup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specmoe.decoding.expert_sets import indices_to_sets
from specmoe.interfaces.predictor import Predictor
from specmoe.interfaces.tree import DraftTree

__all__ = ["OraclePredictor"]


class OraclePredictor(Predictor):
    """Ground-truth expert sets of every tree node from a look-ahead target pass (KV restored after)."""

    description = "target router on the tree (ground truth; analysis only)"
    analysis_only = True

    @dataclass
    class Config:
        pass

    def setup(self, target: Any) -> None:
        self.target = target

    @torch.no_grad()
    def predict(self, state: Any, tree: DraftTree, target_kv: Any = None) -> torch.Tensor:
        if target_kv is None:
            raise ValueError("the oracle predictor needs the target's KV state")
        positions = target_kv.next_position()[:, None] + tree.depth
        out = self.target.forward(tree.tokens, target_kv, positions, tree.ancestors(), tree.valid,
                                  capture_routing=True)
        target_kv.drop_last(tree.num_nodes)
        return indices_to_sets(out.routing, self.target.num_experts)
