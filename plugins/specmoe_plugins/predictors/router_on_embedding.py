# SPDX-License-Identifier: Apache-2.0
"""``router_on_embedding``: zero-training baseline; each MoE layer's own router applied to the token's
normalized input embedding (no context)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specmoe.decoding.expert_sets import indices_to_sets
from specmoe.interfaces.predictor import Predictor
from specmoe.interfaces.tree import DraftTree

__all__ = ["RouterOnEmbeddingPredictor"]


class RouterOnEmbeddingPredictor(Predictor):
    """Router_l(norm_l(embed(token))) per MoE layer l; top-K as the target's router picks them."""

    description = "each layer's router on the normalized token embedding (no training)"

    @dataclass
    class Config:
        cache_table: bool = True
        """precompute the prediction for the whole vocabulary once (a lookup per node afterwards)."""

    def setup(self, target: Any) -> None:
        self.target = target
        self._table: torch.Tensor | None = None

    @torch.no_grad()
    def _route(self, ids: torch.Tensor) -> torch.Tensor:
        """``[T]`` ids -> ``[T, L, K]`` expert ids."""
        h = self.target.embed(ids)
        out = []
        for norm, router in zip(self.target.router_inputs_norms(), self.target.routers()):
            x = h.to(norm.weight.device)  # a target spread over devices: each layer runs where it lives
            out.append(router(norm(x))[-1].to(ids.device))
        return torch.stack(out, dim=1)

    @torch.no_grad()
    def predict(self, state: Any, tree: DraftTree) -> torch.Tensor:
        if self.config.cache_table:
            if self._table is None:
                v = self.target.vocab_size
                chunks = [self._route(torch.arange(s, min(s + 4096, v), device=self.target.device))
                          for s in range(0, v, 4096)]
                self._table = torch.cat(chunks, dim=0)  # [V, L, K]
            idx = self._table[tree.tokens]
        else:
            b, n = tree.tokens.shape
            idx = self._route(tree.tokens.reshape(-1)).view(b, n, *self._table_shape())
        return indices_to_sets(idx, self.target.num_experts)

    def _table_shape(self) -> tuple[int, int]:
        return self.target.num_moe_layers, self.target.top_k
