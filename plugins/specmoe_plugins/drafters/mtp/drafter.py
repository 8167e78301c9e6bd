# SPDX-License-Identifier: Apache-2.0
"""``mtp``: DeepSeek-V3 style multi-token-prediction head as the drafter (DeepSeek-V3.1's own drafter).

The head (see :mod:`specmoe_plugins.drafters.mtp.model`) consumes the target's final normalized hidden state
(``feature_layers = [-1]``) and is reused recursively for deeper draft levels: a tree node's input hidden
state is its parent's head output. It keeps its own one-layer KV cache of the committed context; tree nodes
live in temporary slots while the candidate pool is expanded (as in ``draft_model``) and are dropped after.

Slot layout: the committed token at position ``q`` enters the slot at position ``q - 1`` together with the
target hidden state of position ``q - 1`` (``Committed.features``); the prompt's first token has no previous
hidden state and is skipped. The root's slot output gives the first draft level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from specmoe.decoding.tree_builder import build_pool, pool_size, proposer_features
from specmoe.errors import UserError
from specmoe.interfaces.drafter import Committed, Drafter
from specmoe.interfaces.kv import KVState
from specmoe.interfaces.options import DType, torch_dtype
from specmoe.interfaces.tree import DraftTree
from specmoe.models import linear

__all__ = ["MTPDrafter", "MTPState"]


@dataclass
class MTPState:
    """Per-generation drafter state.

    Attributes:
        kv: the head's KV cache of committed slots.
        root: ``[B]`` current root token.
        root_logp: ``[B, V]`` draft log-probabilities of the token after the root.
        root_hidden: ``[B, H]`` recursion hidden state of the root's slot (input of depth-2 nodes).
        root_slot: ``[B]`` slot position of the root (its token position - 1).
        prev_hidden: ``[B, H]`` recursion hidden state of the slot before the root's (the root's feature).
    """

    kv: KVState
    root: torch.Tensor
    root_logp: torch.Tensor | None = None
    root_hidden: torch.Tensor | None = None
    root_slot: torch.Tensor | None = None
    prev_hidden: torch.Tensor | None = None


class MTPDrafter(Drafter):
    """Tree drafting with an MTP head on the target's last hidden state."""

    description = "DeepSeek-V3 style MTP head (checkpoint's own or trained by train_mtp), reused recursively"

    @dataclass
    class Config:
        path: Optional[str] = None
        """DeepSeek-V3 checkpoint with MTP weights, or a ``train_mtp`` output directory; default: the
        target's own checkpoint directory."""
        dtype: Optional[DType] = None
        """``float32``, ``bfloat16``, ``float16``; default: the target's dtype."""
        layer_index: Optional[int] = None
        """checkpoint layer holding the MTP module; default: the checkpoint's ``num_hidden_layers``."""
        recurse: Optional[str] = None
        """hidden fed to deeper levels: ``normed`` or ``block``; default: the head's own setting
        (``normed`` for released checkpoints)."""

    @property
    def feature_layers(self) -> list[int]:
        return [-1]

    @property
    def feature_size(self) -> int:
        return int(self.head.config.hidden_size) if getattr(self, "head", None) is not None else 0

    @torch.no_grad()
    def teacher_features(self, tokens: torch.Tensor, valid: torch.Tensor, target_hidden: torch.Tensor | None,
                         depths: int = 1) -> list[torch.Tensor]:
        """The head unrolled over the sequences (:func:`~specmoe_plugins.drafters.mtp.model.unroll`): at every
        depth ``d`` the slot at ``p`` proposes token ``p + 2`` as a depth-``d`` node."""
        from specmoe_plugins.drafters.mtp.model import unroll

        if target_hidden is None:
            raise UserError("drafter mtp: teacher_features needs the target's final normalized hidden states")
        t = tokens.shape[1]
        hidden = target_hidden[:, :max(t - 1, 0)].to(self._dtype)
        feats = []
        for o in unroll(self.head, tokens[:, 1:], hidden, valid[:, 1:], depths):
            f = o.new_zeros(*tokens.shape, o.shape[-1])
            f[:, 2:] = self.head.recurse(o)[:, :t - 2]
            feats.append(f)
        return feats

    def setup(self, target: Any) -> None:
        from specmoe_plugins.drafters.mtp.checkpoint import load_head

        cfg = self.config
        path = cfg.path or getattr(target, "path", None)
        if not path:
            raise UserError("drafter mtp: set 'path' (a DeepSeek-V3 checkpoint with MTP weights or a "
                            "train_mtp output directory); the target has no local checkpoint directory to "
                            "default to")
        dtype = torch_dtype(cfg.dtype, target.dtype, where="drafter mtp.dtype")
        self.target = target
        self.head = load_head(target.parts(), path, device=target.device, dtype=dtype,
                              layer_index=cfg.layer_index, recurse=cfg.recurse)
        self.head.eval().requires_grad_(False)
        linear.install(self.head)  # inference: skinny rows take the faster CPU BLAS route
        self._dtype = self.head.eh_proj.weight.dtype
        self._vocab = target.vocab_size

    def begin(self, batch_size: int) -> MTPState:
        dev = self.target.device
        return MTPState(KVState(batch_size, dev), torch.zeros(batch_size, dtype=torch.long, device=dev))

    def _run(self, kv: KVState, ids: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor,
             attend: torch.Tensor, valid: torch.Tensor,
             cached_attend: torch.Tensor | None = None) -> torch.Tensor:
        mask = kv.mask(pos, attend, valid, self._dtype, None, cached_attend)
        out = self.head(ids, hidden, pos, mask, kv.cache)
        kv.append(pos, valid)
        return out

    def _logp(self, o: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.head.logits(o)[..., :self._vocab].float(), dim=-1)

    @torch.no_grad()
    def draft(self, state: MTPState, committed: Committed, steps: int, top_k: int) -> DraftTree:
        if committed.features is None:
            raise RuntimeError("mtp drafter: the engine passed no target features (feature_layers = [-1])")
        kv = state.kv
        tok, val, pos = committed.tokens, committed.valid, committed.positions
        bsz, m = tok.shape
        dev = tok.device
        slot_pos = (pos - 1).clamp(min=0)
        causal = torch.ones(m, m, dtype=torch.bool, device=dev).tril().expand(bsz, m, m)
        o = self._run(kv, tok, committed.features, slot_pos, causal, val & (pos > 0))
        counts = val.sum(dim=1)
        has_new = counts > 0
        last = (counts - 1).clamp(min=0)
        ar_b = torch.arange(bsz, device=dev)
        o_last = o[ar_b, last]
        logp, hid, slot = self._logp(o_last), self.head.recurse(o_last), slot_pos[ar_b, last]
        # the slot before the root's: in this call when it committed two tokens or more, else the last root's
        before = (counts > 1) & (pos[ar_b, (last - 1).clamp(min=0)] > 0)
        older = state.root_hidden if state.root_hidden is not None else torch.zeros_like(hid)
        prev = torch.where(before[:, None], self.head.recurse(o[ar_b, (last - 1).clamp(min=0)]), older)
        if state.root_logp is not None:
            logp = torch.where(has_new[:, None], logp, state.root_logp)
            hid = torch.where(has_new[:, None], hid, state.root_hidden)
            slot = torch.where(has_new, slot, state.root_slot)
            prev = torch.where(has_new[:, None], prev, state.prev_hidden)
        state.root = torch.where(has_new, tok[ar_b, last], state.root)
        state.root_logp, state.root_hidden, state.root_slot, state.prev_hidden = logp, hid, slot, prev

        n_pool = pool_size(steps, top_k)
        node_hidden = torch.zeros(bsz, n_pool, hid.shape[-1], dtype=hid.dtype, device=dev)
        node_hidden[:, 0] = hid
        pool_ar = torch.arange(n_pool, device=dev)
        n_ctx = kv.num_slots
        processed: list[torch.Tensor] = []  # pool indices of the nodes in temporary slots

        def expand(tokens: torch.Tensor, pool_idx: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
            k = tokens.shape[1]
            depth = ancestors.sum(dim=-1)
            parent = torch.where(ancestors, pool_ar, -1).amax(dim=-1)  # deepest strict ancestor
            h_in = node_hidden.gather(1, parent[..., None].expand(bsz, k, node_hidden.shape[-1]))
            n_tmp = kv.num_slots - n_ctx
            cached = torch.ones(bsz, k, kv.num_slots, dtype=torch.bool, device=dev)
            if n_tmp:
                done = torch.cat(processed, dim=1)
                cached[:, :, n_ctx:] = ancestors.gather(2, done[:, None, :].expand(bsz, k, n_tmp))
            eye = torch.eye(k, dtype=torch.bool, device=dev).expand(bsz, k, k)
            out = self._run(kv, tokens, h_in, state.root_slot[:, None] + depth, eye,
                            torch.ones(bsz, k, dtype=torch.bool, device=dev), cached)
            processed.append(pool_idx)
            node_hidden.scatter_(1, pool_idx[..., None].expand(bsz, k, node_hidden.shape[-1]),
                                 self.head.recurse(out).to(node_hidden.dtype))
            return self._logp(out)

        tree = build_pool(state.root, state.root_logp, expand, steps, top_k)
        kv.drop_last(kv.num_slots - n_ctx)
        tree.features = proposer_features(tree.parents, node_hidden, state.prev_hidden)
        return tree
