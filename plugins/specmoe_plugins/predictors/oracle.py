# SPDX-License-Identifier: Apache-2.0
"""``oracle``: the target's own router run on the whole draft tree (analysis only, paper Table 10).

It keeps its own KV cache of the committed context, built by target passes over the committed tokens
(:meth:`observe`), so the root's experts come from that pass; :meth:`predict` runs the target once over the
other tree nodes (each sees the context and its own ancestors, as in verification) and forgets those slots.
Its time is reported as T_pred and methods using it are marked analysis-only: never a real speedup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specmoe.decoding.expert_sets import indices_to_sets
from specmoe.interfaces.drafter import Committed
from specmoe.interfaces.kv import KVState
from specmoe.interfaces.predictor import Predictor
from specmoe.interfaces.tree import DraftTree

__all__ = ["OraclePredictor", "OracleState"]


@dataclass
class OracleState:
    """The oracle's copy of the target's committed KV and the root's routing ``[B, L, K]``."""

    kv: KVState
    root_routing: torch.Tensor


class OraclePredictor(Predictor):
    """Ground-truth expert sets of every tree node from look-ahead target passes."""

    description = "target router on the tree (ground truth; analysis only)"
    analysis_only = True

    @dataclass
    class Config:
        pass

    def setup(self, target: Any) -> None:
        self.target = target

    def begin(self, batch_size: int) -> OracleState:
        t = self.target
        return OracleState(t.new_kv(batch_size),
                           torch.zeros(batch_size, t.num_moe_layers, t.top_k, dtype=torch.long, device=t.device))

    @torch.no_grad()
    def observe(self, state: OracleState, committed: Committed) -> None:
        out = self.target.forward(committed.tokens, state.kv, committed.positions, None, committed.valid,
                                  capture_routing=True)
        counts = committed.valid.sum(dim=1)
        rows = torch.arange(counts.shape[0], device=counts.device)
        last = out.routing[rows, (counts - 1).clamp(min=0)]  # [B, L, K] of each row's newest token (the root)
        state.root_routing = torch.where((counts > 0)[:, None, None], last, state.root_routing)

    @torch.no_grad()
    def predict(self, state: OracleState, tree: DraftTree) -> torch.Tensor:
        routing = [state.root_routing[:, None]]
        n = tree.num_nodes
        if n > 1:
            kv = state.kv
            positions = (kv.next_position() - 1)[:, None] + tree.depth[:, 1:]
            out = self.target.forward(tree.tokens[:, 1:], kv, positions, tree.ancestors()[:, 1:, 1:],
                                      tree.valid[:, 1:], capture_routing=True)
            kv.drop_last(n - 1)
            routing.append(out.routing)
        return indices_to_sets(torch.cat(routing, dim=1), self.target.num_experts)
