# SPDX-License-Identifier: Apache-2.0
"""``draft_model``: classic speculative decoding with a small Hugging Face causal LM as the drafter.

The draft model must share the target's vocabulary. It keeps its own KV cache of the committed context;
while it expands a tree, uncommitted nodes live in extra cache slots that are dropped afterwards.
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
from specmoe.models.hf_masks import MaskSpec

__all__ = ["DraftModelDrafter", "DraftState"]


@dataclass
class DraftState:
    kv: KVState
    root: torch.Tensor  # [B] current root token
    root_logp: torch.Tensor | None = None  # [B, V]
    root_hidden: torch.Tensor | None = None  # [B, H] last hidden state at the root (node features)
    prev_hidden: torch.Tensor | None = None  # [B, H] ... at the committed token before the root


class DraftModelDrafter(Drafter):
    """Tree drafting with an independent small causal LM (or the target itself, for testing)."""

    description = "small HF causal LM with the target's vocabulary (classic SD)"

    @dataclass
    class Config:
        path: Optional[str] = None
        """checkpoint directory or hub id of the draft LM."""
        tiny: Optional[dict[str, Any]] = None
        """build a tiny random draft model (``{arch: ..., seed: ...}``; vocabulary taken from the target)."""
        share_target: bool = False
        """draft with the target model itself (correctness tests; never a speedup)."""
        dtype: Optional[DType] = None
        """default: the target's dtype."""
        attn_implementation: str = "eager"
        cache_dir: str = ".specmoe_cache/tiny_drafters"

    def setup(self, target: Any) -> None:
        import transformers

        cfg = self.config
        self.target = target
        self.model = None
        if cfg.share_target:  # the target's own tree forward pass (with its masks) drafts
            self._vocab = target.vocab_size
            return
        if cfg.tiny is not None:
            from specmoe.models.tiny import build_tiny_model, spec_hash

            tiny = dict(cfg.tiny)
            arch = tiny.pop("arch", "qwen3_moe")
            seed = int(tiny.pop("seed", 0))
            tiny.setdefault("vocab_size", target.vocab_size)
            path = str(build_tiny_model(arch, f"{cfg.cache_dir}/{arch}-{spec_hash(arch, seed, tiny)}",
                                        seed=seed, **tiny))
        elif cfg.path:
            path = cfg.path
        else:
            raise UserError("drafter draft_model: set 'path' (a draft LM), 'tiny' or 'share_target: true'")
        dtype = torch_dtype(cfg.dtype, target.dtype, where="drafter draft_model.dtype")
        try:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, attn_implementation=cfg.attn_implementation)
        except OSError as exc:
            raise UserError(f"drafter draft_model: cannot load '{path}': {exc}") from exc
        self.model.to(target.device).eval().requires_grad_(False)
        linear.install(self.model)  # inference: skinny rows take the faster CPU BLAS route
        vocab = int(self.model.config.vocab_size)
        if vocab < target.vocab_size:
            raise UserError(f"drafter draft_model: vocabulary {vocab} is smaller than the target's "
                            f"{target.vocab_size}; a draft model must share the target's vocabulary")
        self._vocab = target.vocab_size
        self._masks = MaskSpec(self.model.config)
        self._dtype = self.model.get_input_embeddings().weight.dtype

    @property
    def feature_size(self) -> int:
        if self.model is None:
            return int(self.target.hidden_size)
        return int(self.model.config.hidden_size)

    @torch.no_grad()
    def teacher_features(self, tokens: torch.Tensor, valid: torch.Tensor, target_hidden: torch.Tensor | None,
                         depths: int = 1) -> list[torch.Tensor]:
        """The draft LM's last hidden state at the position before each token: the same at every depth (the
        draft LM reads only tokens, so a path drafted in a tree is processed exactly as committed text)."""
        pos = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        if self.model is None:
            h = self.target.forward_standard(tokens, valid.long(), pos, hidden_layers=[-1],
                                             compute_logits=False).hidden
        else:
            h = self.model(input_ids=tokens, attention_mask=valid.long(), position_ids=pos, output_hidden_states=True,
                           logits_to_keep=1).hidden_states[-1]
        f = torch.zeros_like(h)
        f[:, 1:] = h[:, :-1]
        return [f] * depths

    def begin(self, batch_size: int) -> DraftState:
        dev = self.target.device
        kv = self.target.new_kv(batch_size) if self.model is None else KVState(batch_size, dev)
        return DraftState(kv, torch.zeros(batch_size, dtype=torch.long, device=dev))

    def _run(self, kv: KVState, ids: torch.Tensor, pos: torch.Tensor, attend: torch.Tensor, valid: torch.Tensor,
             cached_attend: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``ids [B, N]`` appended to ``kv`` -> ``([B, N, V]`` float32 draft log-probabilities, ``[B, N, H]`` last
        hidden states)."""
        if self.model is None:
            out = self.target.forward(ids, kv, pos, attend, valid, cached_attend=cached_attend, hidden_layers=[-1])
            logits, hidden = out.logits, out.hidden
        else:
            mask = self._masks.build(kv, pos, attend, valid, self._dtype, cached_attend)
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=kv.cache,
                             use_cache=True, output_hidden_states=True)
            logits, hidden = out.logits, out.hidden_states[-1]
            kv.append(pos, valid)
        return torch.log_softmax(logits[..., :self._vocab].float(), dim=-1), hidden

    @torch.no_grad()
    def draft(self, state: DraftState, committed: Committed, steps: int, top_k: int) -> DraftTree:
        kv = state.kv
        bsz, m = committed.tokens.shape
        dev = committed.tokens.device
        causal = torch.ones(m, m, dtype=torch.bool, device=dev).tril().expand(bsz, m, m)
        logp, hidden = self._run(kv, committed.tokens, committed.positions, causal, committed.valid)
        counts = committed.valid.sum(dim=1)
        has_new = counts > 0
        last = (counts - 1).clamp(min=0)
        ar_b = torch.arange(bsz, device=dev)
        new_root = committed.tokens[ar_b, last]
        state.root = torch.where(has_new, new_root, state.root)
        root_logp, root_hidden = logp[ar_b, last], hidden[ar_b, last]
        older = state.root_hidden if state.root_hidden is not None else torch.zeros_like(root_hidden)
        prev_hidden = torch.where((counts > 1)[:, None], hidden[ar_b, (last - 1).clamp(min=0)], older)
        if state.root_logp is not None:
            root_logp = torch.where(has_new[:, None], root_logp, state.root_logp)
            root_hidden = torch.where(has_new[:, None], root_hidden, state.root_hidden)
            prev_hidden = torch.where(has_new[:, None], prev_hidden, state.prev_hidden)
        state.root_logp, state.root_hidden, state.prev_hidden = root_logp, root_hidden, prev_hidden
        node_hidden = root_hidden.new_zeros(bsz, pool_size(steps, top_k), root_hidden.shape[-1])
        node_hidden[:, 0] = root_hidden
        root_pos = kv.next_position() - 1  # the root is the last committed token
        n_ctx = kv.num_slots
        processed: list[torch.Tensor] = []  # pool indices of the tree nodes in temporary slots

        def expand(tokens: torch.Tensor, pool_idx: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
            k = tokens.shape[1]
            depth = ancestors.sum(dim=-1)  # strict ancestors incl. root = depth
            pos = root_pos[:, None] + depth
            n_tmp = kv.num_slots - n_ctx
            cached = torch.ones(bsz, k, kv.num_slots, dtype=torch.bool, device=dev)
            if n_tmp:
                done = torch.cat(processed, dim=1)  # [B, n_tmp] pool idx of temporary slots
                cached[:, :, n_ctx:] = ancestors.gather(2, done[:, None, :].expand(bsz, k, n_tmp))
            eye = torch.eye(k, dtype=torch.bool, device=dev).expand(bsz, k, k)
            out, h = self._run(kv, tokens, pos, eye, torch.ones(bsz, k, dtype=torch.bool, device=dev), cached)
            processed.append(pool_idx)
            node_hidden[ar_b[:, None], pool_idx] = h.to(node_hidden.dtype)
            return out

        tree = build_pool(state.root, root_logp, expand, steps, top_k)
        kv.drop_last(kv.num_slots - n_ctx)
        tree.features = proposer_features(tree.parents, node_hidden, prev_hidden)
        return tree
