# SPDX-License-Identifier: Apache-2.0
"""``token_table``: zero-parameter baseline; per token id the experts the router chose most often for it in
the training traces (per layer), the globally most frequent experts for unseen tokens. One lookup per node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specmoe.decoding.expert_sets import indices_to_sets
from specmoe.errors import UserError
from specmoe.interfaces.predictor import Predictor
from specmoe.interfaces.tree import DraftTree
from specmoe_plugins.predictors.token_table.table import TokenTable

__all__ = ["TokenTablePredictor"]


class TokenTablePredictor(Predictor):
    """Context-free lookup of a table built by the ``build_token_table`` stage."""

    description = "most frequent experts per token id from routing traces (no context, no training)"

    @dataclass
    class Config:
        path: str = ""
        """output directory of the ``build_token_table`` stage (holds ``token_table.safetensors``)."""

    def setup(self, target: Any) -> None:
        if not self.config.path:
            raise UserError("predictor token_table: set 'path' to the build_token_table stage output")
        self.table = TokenTable.load(self.config.path)
        m = self.table.meta
        want = {"num_layers": target.num_moe_layers, "num_experts": target.num_experts, "top_k": target.top_k}
        bad = {k: (m.get(k), v) for k, v in want.items() if m.get(k) is not None and int(m[k]) != int(v)}
        if bad:
            raise UserError(f"predictor token_table: '{self.config.path}' was built for another target "
                            f"(table vs target: {bad})")
        self.num_experts = int(target.num_experts)

    @torch.no_grad()
    def predict(self, state: Any, tree: DraftTree) -> torch.Tensor:
        sets = indices_to_sets(self.table.lookup(tree.tokens), self.num_experts)
        return sets & tree.valid[:, :, None, None]
