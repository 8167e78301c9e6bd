# SPDX-License-Identifier: Apache-2.0
"""``eagle3``: EAGLE-3 drafting (fused target features, one draft layer, EAGLE-2/3 dynamic tree).

Loads the released EAGLE-3 format (``lmsys/EAGLE3-gpt-oss-120b-bf16``, ``lmsys/Qwen3-235B-A22B-EAGLE3``,
SpecForge exports, drafts trained by ``train_eagle3`` / ``train_gto``) or builds an untrained draft shaped
after the target (``init``). The target hidden states it needs are the boundaries named by
``eagle_config.eagle_aux_hidden_state_layer_ids`` in the serving engines' convention
(:func:`~specmoe_plugins.drafters.eagle3.model.capture_indices`).

Per draft call: one draft forward over the newly committed tokens (paired with the target features before
them; it also yields the root's distribution), then one forward per further tree level. The draft KV cache is
preallocated and written in place; it keeps only committed context (tree keys use its free slots while a pool
is built).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

import torch

from specmoe.errors import UserError
from specmoe.interfaces.drafter import Committed, Drafter
from specmoe.interfaces.options import DType, torch_dtype
from specmoe.interfaces.tree import DraftTree
from specmoe.models import linear
from specmoe_plugins.drafters.eagle3.model import (
    Eagle3Config,
    Eagle3Model,
    capture_indices,
    default_aux_layer_ids,
)
from specmoe_plugins.drafters.eagle3.tree import TreeContext, draft_pool

__all__ = ["Eagle3Drafter", "Eagle3State", "init_config"]

#: slots a fresh draft cache holds beyond twice the first committed block (grows by doubling beyond)
_ROOM = 256


def init_config(target: Any, **overrides: Any) -> Eagle3Config:
    """An EAGLE-3 config shaped after ``target`` (hidden size, heads, MLP width, vocabulary, norms, RoPE).

    ``overrides`` may set any :class:`Eagle3Config` field (e.g. ``draft_vocab_size``, ``aux_layer_ids``).
    """
    hc = target.parts().config
    heads = int(hc.num_attention_heads)
    rope = getattr(hc, "rope_parameters", None) or {}
    kw: dict[str, Any] = dict(
        hidden_size=target.hidden_size,
        intermediate_size=int(getattr(hc, "intermediate_size", 4 * target.hidden_size)),
        num_attention_heads=heads, num_key_value_heads=int(getattr(hc, "num_key_value_heads", None) or heads),
        head_dim=target.hidden_size // heads, vocab_size=target.vocab_size,
        draft_vocab_size=min(32000, target.vocab_size), rms_norm_eps=float(getattr(hc, "rms_norm_eps", 1e-6)),
        max_position_embeddings=int(getattr(hc, "max_position_embeddings", 4096)),
        rope_theta=float(rope.get("rope_theta", getattr(hc, "rope_theta", 10000.0))),
        torch_dtype=str(target.dtype).replace("torch.", ""))
    if heads % kw["num_key_value_heads"]:
        kw["num_key_value_heads"] = heads
    known = {f.name for f in fields(Eagle3Config)} - {"raw"}
    bad = sorted(set(overrides) - known)
    if bad:
        raise UserError(f"EAGLE-3 draft options {bad} are not config fields; valid: "
                        f"{', '.join(sorted(known))}")
    kw.update(overrides)
    if kw["draft_vocab_size"] > kw["vocab_size"]:
        raise UserError(f"EAGLE-3 draft_vocab_size {kw['draft_vocab_size']} exceeds the target vocabulary "
                        f"{kw['vocab_size']}")
    if kw.get("aux_layer_ids") is None:
        kw["aux_layer_ids"] = default_aux_layer_ids(target.num_hidden_layers)
    return Eagle3Config(**kw)


@dataclass
class Eagle3State:
    """Per-generation draft state: the committed-context KV cache and the current root."""

    ctx: Optional[TreeContext] = None  # keys / values [B, Hkv, C, D] and validity [B, C] of committed slots
    root: Optional[torch.Tensor] = None  # [B]
    root_hidden: Optional[torch.Tensor] = None  # [B, H]
    root_logp: Optional[torch.Tensor] = None  # [B, Vd]
    root_pos: Optional[torch.Tensor] = None  # [B]
    prev_hidden: Optional[torch.Tensor] = None  # [B, H] output of the step before the root's (node features)

    @property
    def k(self) -> Optional[torch.Tensor]:
        """``[B, Hkv, S, D]`` cached keys of the committed context (a view)."""
        return None if self.ctx is None else self.ctx.k.narrow(2, 0, self.ctx.length)

    @property
    def v(self) -> Optional[torch.Tensor]:
        return None if self.ctx is None else self.ctx.v.narrow(2, 0, self.ctx.length)

    @property
    def valid(self) -> Optional[torch.Tensor]:
        """``[B, S]`` bool committed slots."""
        return None if self.ctx is None else self.ctx.allowed.narrow(1, 0, self.ctx.length)


class Eagle3Drafter(Drafter):
    """EAGLE-3 draft model with its own KV cache of accepted context."""

    description = "EAGLE-3 draft (released checkpoint format), EAGLE-2/3 dynamic tree"

    @dataclass
    class Config:
        path: Optional[str] = None
        """EAGLE-3 checkpoint directory or hub id (``lmsys/EAGLE3-gpt-oss-120b-bf16``), or ``stage:<id>``."""
        init: Optional[dict[str, Any]] = None
        """build an untrained draft shaped after the target instead: ``{seed: 0, <Eagle3Config field>: ...}``
        (for tests and as a training start)."""
        dtype: Optional[DType] = None
        """``float32`` / ``bfloat16`` / ``float16``; default: the target's dtype."""
        revision: Optional[str] = None
        local_files_only: bool = False
        frontier: Optional[int] = None
        """nodes expanded per tree level (one draft forward over them each); default ``top_k`` (EAGLE-2/3's
        pool: 10 nodes for 3 steps x top-2). ``1``: the best path is expanded, with the ``top_k`` children of
        each of its nodes (7 nodes for 3 steps x top-2), drafted at a chain's cost (on a CPU a forward over two
        rows costs about twice one); a selector with calibrated values still takes a runner-up where it is worth
        more than the path's next node."""

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        if self.config.frontier is not None and self.config.frontier < 1:
            raise UserError(f"drafter {self._name()}: frontier must be >= 1 (nodes expanded per tree level), got "
                            f"{self.config.frontier}")
        if (self.config.path is None) == (self.config.init is None):
            raise UserError(f"drafter {self._name()}: set exactly one of 'path' (an EAGLE-3 checkpoint) and "
                            f"'init' (an untrained draft)")
        self.model: Optional[Eagle3Model] = None
        self._layers: list[int] = []

    def _name(self) -> str:
        return "eagle3"

    # ------------------------------------------------------------------ setup
    @property
    def feature_layers(self) -> list[int]:
        return list(self._layers)

    @property
    def feature_size(self) -> int:
        return int(self.model.config.hidden_size) if self.model is not None else 0

    @torch.no_grad()
    def teacher_features(self, tokens: torch.Tensor, valid: torch.Tensor, target_hidden: torch.Tensor | None,
                         depths: int = 1) -> list[torch.Tensor]:
        """Training-time-test unroll (:func:`~specmoe_plugins.drafters.eagle3.ttt.ttt_unroll`): step ``j`` at
        index ``i`` consumed token ``i + 1 + j`` as a depth-``j`` node, so it proposed the depth-``j + 1``
        node at position ``i + 2 + j``."""
        from specmoe_plugins.drafters.eagle3.ttt import ttt_unroll

        if target_hidden is None:
            raise UserError(f"drafter {self._name()}: teacher_features needs the target's hidden states "
                            f"{self.feature_layers}")
        out = ttt_unroll(self.model, tokens, target_hidden, valid, depths, logits=False)
        feats = []
        for d, h in enumerate(out.hidden, start=1):
            f = h.new_zeros(*tokens.shape, h.shape[-1])
            f[:, d + 1:] = h[:, :tokens.shape[1] - d - 1]
            feats.append(f)
        return feats

    def setup(self, target: Any) -> None:
        from specmoe_plugins.drafters.eagle3.checkpoint import load_eagle3

        cfg = self.config
        dtype = torch_dtype(cfg.dtype, target.dtype, where=f"drafter {self._name()}.dtype")
        embed = target.parts().embed_tokens.weight
        if cfg.path is not None:
            if cfg.path.startswith("stage:"):
                raise UserError(f"drafter {self._name()}.path '{cfg.path}' was not resolved: run the recipe "
                                f"with 'platform run'")
            model = load_eagle3(cfg.path, embed=embed, dtype=dtype, device=target.device,
                                revision=cfg.revision, local_files_only=cfg.local_files_only)
        else:
            init = dict(cfg.init or {})
            seed = int(init.pop("seed", 0))
            torch.manual_seed(seed)
            model = Eagle3Model(init_config(target, **init))
            with torch.no_grad():
                model.embed_tokens.weight.copy_(embed.detach().to("cpu", model.embed_tokens.weight.dtype))
            model.to(device=target.device, dtype=dtype).eval()
        c = model.config  # a loaded draft was checked against the target's embedding (check_target_fit)
        self._layers = capture_indices(c.aux_layer_ids, target.num_hidden_layers)
        self.model = model.requires_grad_(False)
        linear.install(self.model)  # inference: skinny rows take the faster CPU BLAS route
        self.model.warm_up()  # a compiled step compiles here, not in a timed draft
        self.target = target

    def begin(self, batch_size: int) -> Eagle3State:
        return Eagle3State()

    # ------------------------------------------------------------------ drafting
    @torch.no_grad()
    def _absorb(self, state: Eagle3State, committed: Committed) -> None:
        """Run the draft over the committed (token, previous feature) pairs and update the root."""
        m = self.model
        c = m.config
        tokens, pos = committed.tokens, committed.positions
        bsz, n = tokens.shape
        dev = tokens.device
        if committed.features is None:
            raise UserError("drafter eagle3 got no target features: the engine must request feature_layers")
        valid = committed.valid & (pos > 0)  # position 0 has no previous feature (EAGLE drops it too)
        dtype = m.fc.weight.dtype
        hidden = m.project(committed.features.to(device=m.fc.weight.device, dtype=dtype))
        if state.ctx is None:
            shape = (bsz, c.num_key_value_heads, 2 * n + _ROOM, c.head_dim)
            state.ctx = TreeContext(torch.zeros(shape, dtype=dtype, device=dev),
                                    torch.zeros(shape, dtype=dtype, device=dev),
                                    torch.zeros(bsz, shape[2], dtype=torch.bool, device=dev), 0)
        ctx = state.ctx
        s = ctx.length
        ctx.reserve(n)
        causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()[None] & valid[:, None, :]
        causal = causal | torch.eye(n, dtype=torch.bool, device=dev)[None]  # padding queries see themselves
        old = state.valid[:, None, :].expand(bsz, n, s) & valid[:, :, None]
        out, logps = m.step_logp(tokens, hidden, pos - 1, ctx.k, ctx.v, s, torch.cat([old, causal], dim=2))
        ctx.allowed.narrow(1, s, n).copy_(valid)
        ctx.length = s + n
        counts = valid.sum(dim=1)
        has = counts > 0
        last = valid.long().cumsum(dim=1).argmax(dim=1)  # index of the last valid pair
        ar = torch.arange(bsz, device=dev)
        h_last = out[ar, last]
        logp = logps[ar, last]
        # the step before the root's: in this call when it committed two pairs or more, else the last root's
        before = valid[ar, (last - 1).clamp(min=0)] & (counts > 1)
        older = state.root_hidden if state.root_hidden is not None else torch.zeros_like(h_last)
        h_prev = torch.where(before[:, None], out[ar, (last - 1).clamp(min=0)], older)
        if state.root is None:
            state.root, state.root_hidden, state.root_logp = tokens[ar, last], h_last, logp
            state.root_pos, state.prev_hidden = pos[ar, last] - 1, h_prev
            return
        keep = lambda new, old_: torch.where(has.view(-1, *[1] * (new.dim() - 1)), new, old_)
        state.prev_hidden = keep(h_prev, state.prev_hidden)
        state.root = keep(tokens[ar, last], state.root)
        state.root_hidden = keep(h_last, state.root_hidden)
        state.root_logp = keep(logp, state.root_logp)
        state.root_pos = keep(pos[ar, last] - 1, state.root_pos)

    @torch.no_grad()
    def draft(self, state: Eagle3State, committed: Committed, steps: int, top_k: int) -> DraftTree:
        self._absorb(state, committed)
        return draft_pool(self.model, state.ctx, state.root, state.root_hidden, state.root_logp, state.root_pos,
                          steps, top_k, prev_hidden=state.prev_hidden, width=self.config.frontier)
