# SPDX-License-Identifier: Apache-2.0
"""``draft_head``: a routing head on the drafter's own node features (exported by ``train_draft_head``).

Every draft tree of a feature-providing drafter (``eagle3``, ``gto``, ``mtp``, ``draft_model``) carries, per node,
the drafter state that proposed it (:attr:`~specmoe.interfaces.tree.DraftTree.features`). The head maps it,
with the node token's target embedding, to ``L x E`` routing logits (:mod:`.model`) in one
batched call for the whole tree; the top-K per layer is the prediction. No state, no pass over committed
tokens, no model of its own beyond the head: its time (the engine's ``T_pred``) is two small matmuls and the
top-K. The token term is looked up in a ``[V, rank]`` table built at setup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from specmoe.errors import UserError
from specmoe.interfaces.options import DType, torch_dtype
from specmoe.interfaces.predictor import Predictor
from specmoe.interfaces.tree import DraftTree
from specmoe_plugins.predictors.draft_head.model import DraftHeadConfig, DraftHeadNet, load_draft_head, predict_sets

__all__ = ["DraftHeadPredictor"]


class DraftHeadPredictor(Predictor):
    """Drafter feature (+ token embedding) -> per-layer routing logits; top-K per layer is the prediction."""

    description = "routing head on the drafter's own node features (train_draft_head); near-free"
    uses_draft_features = True

    @dataclass
    class Config:
        path: str = ""
        """exported head directory: ``<train_draft_head output>/head`` (or ``.../milestones/acc60``)."""
        init: Optional[dict[str, Any]] = None
        """an untrained head instead (tests): ``{seed: 0, kind: mlp, rank: 64, use_embedding: true}``, built
        at the first tree (its feature width is the drafter's)."""
        device: Optional[str] = None
        """default: the target's device."""
        dtype: Optional[DType] = None
        """``float32``, ``bfloat16``, ``float16``; default: ``float32`` (the head is tiny)."""
        token_table: bool = True
        """precompute the token term of the whole vocabulary (``[V, rank]``) at setup."""

    def setup(self, target: Any) -> None:
        cfg = self.config
        if bool(cfg.path) == (cfg.init is not None):
            raise UserError("predictor draft_head: set exactly one of 'path' (a train_draft_head export) and "
                            "'init' (an untrained head)")
        self.target = target
        self.device = torch.device(cfg.device) if cfg.device else target.device
        self.dtype = torch_dtype(cfg.dtype, torch.float32, where="predictor draft_head.dtype")
        self.net, self._table = None, None
        if cfg.path:
            self.net, meta = load_draft_head(cfg.path, self.device, self.dtype)
            c = self.net.config
            want = {"num_layers": target.num_moe_layers, "num_experts": target.num_experts,
                    "top_k": target.top_k, "embed_size": target.hidden_size}
            bad = {k: (getattr(c, k), v) for k, v in want.items() if int(getattr(c, k)) != int(v)}
            if bad:
                raise UserError(f"predictor draft_head: '{cfg.path}' was trained for another target "
                                f"(head vs target: {bad})")
            self._prepare()

    def _build(self, feature_size: int) -> None:
        init = dict(self.config.init or {})
        torch.manual_seed(int(init.pop("seed", 0)))
        t = self.target
        config = DraftHeadConfig(feature_size=feature_size, embed_size=t.hidden_size, num_layers=t.num_moe_layers,
                                 num_experts=t.num_experts, top_k=t.top_k, **init)
        self.net = DraftHeadNet(config).to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        self._prepare()

    def _prepare(self) -> None:
        c = self.net.config
        if self.config.token_table and c.use_embedding and c.kind != "linear":
            self._table = self.net.token_table(self._embed, self.target.vocab_size)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.target.embed(ids.to(self.target.device)).to(device=self.device, dtype=self.dtype)

    def _check(self, tree: DraftTree) -> torch.Tensor:
        """The tree's features on the head's device (the head is built here for ``init``)."""
        feats = tree.features
        if feats is None:
            raise UserError("predictor draft_head: the drafter attached no node features to its tree "
                            "(DraftTree.features); use it with eagle3, gto, mtp or draft_model")
        if self.net is None:
            self._build(int(feats.shape[-1]))
        c = self.net.config
        if feats.shape[-1] != c.feature_size:
            raise UserError(f"predictor draft_head: the drafter's features are {feats.shape[-1]} wide but the head "
                            f"was trained on {c.feature_size}-wide features of another drafter "
                            f"(trained with: {self.config.path or 'init'})")
        return feats.to(self.device)

    @torch.no_grad()
    def predict_logits(self, tree: DraftTree) -> torch.Tensor:
        """``[B, N, L, E]`` routing logits of every tree node (float32)."""
        feats = self._check(tree)
        if not self.net.config.use_embedding:
            return self.net(feats).float()
        if self._table is not None:
            return self.net(feats, token_term=self._table[tree.tokens.to(self.device)]).float()
        return self.net(feats, self._embed(tree.tokens)).float()

    @torch.no_grad()
    def predict(self, state: Any, tree: DraftTree) -> torch.Tensor:
        feats = self._check(tree)
        sets = predict_sets(self.net, feats, tree.tokens.to(self.device), tree.valid.to(self.device), self._table,
                            self._embed)
        return sets.to(tree.tokens.device)
