# SPDX-License-Identifier: Apache-2.0
"""``learned``: the trained expert predictor of paper §4.1 (exported by the ``train_predictor`` stage).

It keeps its own KV cache of the committed tokens (``observe``), the root included: the root's prediction
comes from that pass. ``predict`` scores all other tree nodes in **one** backbone pass with a tree mask
(each node sees the committed context and its own ancestors), then forgets those slots. Its time is the
engine's ``T_pred``. Inputs are embedded with the target's own (frozen) embedding layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from specmoe.errors import UserError
from specmoe.interfaces.drafter import Committed
from specmoe.interfaces.kv import KVState
from specmoe.interfaces.options import DType, torch_dtype
from specmoe.interfaces.predictor import Predictor
from specmoe.interfaces.tree import DraftTree
from specmoe_plugins.predictors.learned.model import load_predictor, untrained_predictor

__all__ = ["LearnedPredictor", "LearnedState"]


@dataclass
class LearnedState:
    kv: KVState
    root_logits: torch.Tensor  # [B, L, E] prediction for each row's last committed token


class LearnedPredictor(Predictor):
    """Small decoder over target embeddings -> per-layer routing logits; top-K per layer is the prediction."""

    description = "trained expert predictor (paper 4.1): small decoder on target embeddings, tree pass"

    @dataclass
    class Config:
        path: str = ""
        """exported predictor directory: ``<train_predictor output>/predictor`` (or a milestone,
        ``.../milestones/acc50``)."""
        device: Optional[str] = None
        """default: the target's device."""
        dtype: Optional[DType] = None
        """``float32``, ``bfloat16``, ``float16``; default: the target's dtype."""
        attn_implementation: Optional[str] = None
        """default: the one the predictor was trained with (``sdpa``)."""
        init: Optional[dict[str, Any]] = None
        """instead of ``path``: an untrained predictor with seeded random weights (timing), its backbone
        config fields over the default tiny decoder's (``model_type``, ``hidden_size``, ...) and ``seed``."""

    def setup(self, target: Any) -> None:
        from specmoe.models.hf_masks import MaskSpec

        cfg = self.config
        if bool(cfg.path) == (cfg.init is not None):
            raise UserError("predictor learned: set exactly one of 'path' (an exported predictor directory) and "
                            "'init' (an untrained predictor: backbone config fields and 'seed')")
        self.target = target
        self.device = torch.device(cfg.device) if cfg.device else target.device
        self.dtype = torch_dtype(cfg.dtype, target.dtype, where="predictor learned.dtype")
        if cfg.path:
            self.net, self.meta = load_predictor(cfg.path, self.device, self.dtype, cfg.attn_implementation)
        else:
            self.net, self.meta = untrained_predictor(target.num_moe_layers, target.num_experts, target.hidden_size,
                                                      cfg.init, cfg.attn_implementation or "sdpa")
            self.net = self.net.to(device=self.device, dtype=self.dtype)
        want = {"num_layers": target.num_moe_layers, "num_experts": target.num_experts,
                "target_hidden": target.hidden_size}
        bad = {k: (self.meta[k], v) for k, v in want.items() if int(self.meta[k]) != int(v)}
        if bad:
            raise UserError(f"predictor learned: '{cfg.path}' was trained for another target "
                            f"(predictor vs target: {bad})")
        self.top_k = int(target.top_k)
        self._masks = MaskSpec(self.net.backbone.config)

    def begin(self, batch_size: int) -> LearnedState:
        return LearnedState(KVState(batch_size, self.device),
                            torch.zeros(batch_size, self.target.num_moe_layers, self.target.num_experts,
                                        device=self.device))

    def _run(self, kv: KVState, ids: torch.Tensor, pos: torch.Tensor, attend: torch.Tensor,
             valid: torch.Tensor) -> torch.Tensor:
        """One pass over ``ids [B, N]`` appended to ``kv`` -> ``[B, N, L, E]`` float32 logits."""
        ids, pos, attend, valid = (t.to(self.device) for t in (ids, pos, attend, valid))
        embeds = self.target.embed(ids.to(self.target.device)).to(device=self.device, dtype=self.dtype)
        mask = self._masks.build(kv, pos, attend, valid, self.dtype)
        logits = self.net(embeds, position_ids=pos, attention_mask=mask, cache=kv.cache)
        kv.append(pos, valid)
        return logits.float()

    @torch.no_grad()
    def observe(self, state: LearnedState, committed: Committed) -> None:
        b, m = committed.tokens.shape
        if m == 0:
            return
        causal = torch.ones(m, m, dtype=torch.bool, device=self.device).tril().expand(b, m, m)
        logits = self._run(state.kv, committed.tokens, committed.positions, causal, committed.valid)
        counts = committed.valid.sum(dim=1).to(self.device)
        last = (counts - 1).clamp(min=0)
        root = logits[torch.arange(b, device=self.device), last]
        state.root_logits = torch.where((counts > 0)[:, None, None], root, state.root_logits)

    @torch.no_grad()
    def predict_logits(self, state: LearnedState, tree: DraftTree) -> torch.Tensor:
        """``[B, N, L, E]`` float32 routing logits of every tree node (node 0: the committed root)."""
        b, n = tree.tokens.shape
        out = [state.root_logits[:, None]]
        if n > 1:
            kv = state.kv
            root_pos = kv.next_position() - 1
            pos = root_pos[:, None] + tree.depth[:, 1:].to(self.device)
            attend = tree.ancestors()[:, 1:, 1:]
            out.append(self._run(kv, tree.tokens[:, 1:], pos, attend, tree.valid[:, 1:]))
            kv.drop_last(n - 1)
        return torch.cat(out, dim=1)

    @torch.no_grad()
    def predict(self, state: LearnedState, tree: DraftTree) -> torch.Tensor:
        logits = self.predict_logits(state, tree)
        idx = logits.topk(self.top_k, dim=-1).indices
        sets = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, idx, True)
        return (sets & tree.valid.to(self.device)[:, :, None, None]).to(tree.tokens.device)
