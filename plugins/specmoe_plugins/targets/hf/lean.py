# SPDX-License-Identifier: Apache-2.0
"""The decoding forward pass of a Hugging Face MoE model without ``transformers``' per-layer glue.

A decoding pass multiplies one to a few dozen rows by every weight of the model; on a CPU its time is the
weight reads plus a few microseconds per framework operation, and ``transformers``' modeling code spends most
of a small model's step in the second: keyword plumbing and decorators in every module, three projections and
two rotary applications per attention layer, a mask builder and an output record per pass (measured on the demo
target, GPT-OSS 4 x 32 experts, one core of an AMD EPYC Zen 5, float32: 3.0 ms per decoding step of which the
expert and LM-head reads are ~1.2 ms).

:class:`LeanDecoder` runs the same network from the model's own modules and weights, in the model's order:
embedding, per layer ``input_layernorm`` -> attention -> residual -> ``post_attention_layernorm`` -> the model's
own MLP module (its router and experts modules, so the routing hooks, the installed experts implementation and
the routing itself are the model's) -> residual; final norm. What changes is only the attention glue: the
query, key and value projections are one matrix product over their concatenated weights (the same sums per
output; re-concatenated whenever a weight changes), the rotary embedding is the model's own rotary module's
tables (computed once: :class:`specmoe.models.rope.RopeTables`) applied to queries and keys in one call, and
the attention is :func:`.attention.grouped_attention` with the 4D masks the target builds. Norms
are the model's RMSNorm math (float32 statistics) without the module call.

Which models: attention modules with ``q_proj`` / ``k_proj`` / ``v_proj`` / ``o_proj`` linear layers (optional
``q_norm`` / ``k_norm`` per head, optional GPT-OSS sinks) and the half-split rotary convention (GPT-OSS,
Qwen3-MoE, Llama-style); :meth:`LeanDecoder.build` returns ``None`` for others (DeepSeek-V3's latent attention),
which keep the model's own forward. The math is the model's; the order of a few floating-point operations
differs (fused projections and norm), so outputs match the model's forward to rounding (tested), and every pass
of a target that has one (speculative verification, its autoregressive reference) takes this same path.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from specmoe.models import linear
from specmoe.models.rope import RopeTables, rotate
from specmoe_plugins.targets.hf.attention import grouped_attention

__all__ = ["LeanDecoder"]

logger = logging.getLogger(__name__)

_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")

#: reduced-precision CPU passes of at most this many rows run the MLP with oneDNN off (see ``LeanDecoder._mlp``)
NATIVE_ROWS = 8


def _rms_eps(norm: Any) -> float | None:
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    return float(eps) if eps is not None else None


def _plain_rms(norm: Any) -> bool:
    """A norm whose forward is ``weight * (x / rms(x))`` in float32 (the RMSNorms of the supported models;
    Gemma-style ``1 + weight`` or other variants are not)."""
    name = type(norm).__name__
    return (name.endswith("RMSNorm") and "Gemma" not in name and isinstance(getattr(norm, "weight", None), torch.Tensor)
            and norm.weight.dim() == 1 and _rms_eps(norm) is not None)


def _unsupported(model: Any) -> str | None:
    """Why :class:`LeanDecoder` cannot run ``model`` (``None``: it can)."""
    base = getattr(model, "model", None)
    if len({p.device for p in model.parameters()}) > 1 or any(hasattr(m, "_hf_hook") for m in model.modules()):
        return "the model is spread over devices (a device map): each layer runs where it lives"
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(base, name):
            return f"the model has no model.{name}"
    if not _plain_rms(base.norm):
        return f"final norm {type(base.norm).__name__} is not a plain RMSNorm"
    if getattr(model.config, "rope_scaling", None) and "mrope" in str(model.config.rope_scaling):
        return "multimodal rotary embeddings"
    if float(getattr(model.config, "partial_rotary_factor", None) or 1.0) != 1.0:
        return "partial rotary embeddings (the lean path rotates the whole head)"
    for i, layer in enumerate(base.layers):
        attn = getattr(layer, "self_attn", None)
        if attn is None or not all(isinstance(getattr(attn, p, None), torch.nn.Linear) for p in _PROJ):
            return f"layer {i}: attention without q/k/v/o projections ({type(attn).__name__})"
        for norm_name in ("input_layernorm", "post_attention_layernorm"):
            if not _plain_rms(getattr(layer, norm_name, None)):
                return f"layer {i}: {norm_name} is not a plain RMSNorm"
        for norm_name in ("q_norm", "k_norm"):
            norm = getattr(attn, norm_name, None)
            if norm is not None and not _plain_rms(norm):
                return f"layer {i}: {norm_name} is not a plain RMSNorm"
        for extra in ("pre_feedforward_layernorm", "post_feedforward_layernorm", "q_a_proj", "kv_a_proj_with_mqa"):
            if hasattr(layer, extra) or hasattr(attn, extra):
                return f"layer {i} has {extra}"
        if not hasattr(layer, "mlp"):
            return f"layer {i} has no mlp"
    return None


class _Norm:
    """The model's RMSNorm module ``norm`` as a function: float32 statistics, the weight applied in float32, cast
    back (its epsilon read once; its weight on every call, so a changed weight is used)."""

    def __init__(self, norm: Any) -> None:
        self.norm = norm
        self.eps = _rms_eps(norm)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xf = x if x.dtype == torch.float32 else x.float()
        y = self.norm.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))
        return y if y.dtype == x.dtype else y.to(x.dtype)


def _optional_norm(norm: Any) -> _Norm | None:
    return None if norm is None else _Norm(norm)


def _cached_slots(cache: Any) -> int | None:
    """Slots a ``transformers`` cache holds (its longest layer; 0 before the first pass), ``None`` if unknown."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        return None
    return max((int(layer.get_seq_length()) for layer in layers if getattr(layer, "is_initialized", False)),
               default=0)


class _Attention:
    """One attention layer's lean forward over the model's attention module."""

    def __init__(self, attn: Any, config: Any) -> None:
        self.attn = attn
        self.head_dim = int(getattr(attn, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        self.hq = attn.q_proj.out_features // self.head_dim
        self.hkv = attn.k_proj.out_features // self.head_dim
        self.scaling = float(getattr(attn, "scaling", self.head_dim ** -0.5))
        self.q_norm = _optional_norm(getattr(attn, "q_norm", None))
        self.k_norm = _optional_norm(getattr(attn, "k_norm", None))
        self.sinks = getattr(attn, "sinks", None)
        self.qkv = linear.FusedLinear([getattr(attn, p) for p in _PROJ[:3]])
        self.o_proj = linear.FusedLinear([attn.o_proj])
        # reduced precision on a CPU: keys and values cached in float32 (exact: they are bf16 / fp16 values) and
        # the two attention products in float32, where torch's CPU kernels for one to a few query rows are
        # 3x faster than bf16's (demo target, AMD Zen 5: 10 against 32 us per product); the output is cast back
        self.float_attention = linear.reduced_cpu(attn.o_proj.weight)

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Any, layer_idx: int,
                 mask: torch.Tensor | None) -> torch.Tensor:
        b, n, _ = x.shape
        d, hq, hkv = self.head_dim, self.hq, self.hkv
        qkv = self.qkv(x)
        v = qkv[..., (hq + hkv) * d:].view(b, n, hkv, d).transpose(1, 2)
        if self.q_norm is None and self.k_norm is None:  # queries and keys rotated in one call
            qk = rotate(qkv[..., :(hq + hkv) * d].view(b, n, hq + hkv, d).transpose(1, 2), cos, sin)
            q, k = qk[:, :hq], qk[:, hq:]
        else:
            q = qkv[..., :hq * d].view(b, n, hq, d)
            k = qkv[..., hq * d:(hq + hkv) * d].view(b, n, hkv, d)
            if self.q_norm is not None:
                q = self.q_norm(q)
            if self.k_norm is not None:
                k = self.k_norm(k)
            q, k = rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin)
        if self.float_attention:
            q, k, v = q.float(), k.float(), v.float()
        keys, values = cache.update(k, v, layer_idx)
        out, _ = grouped_attention(self.attn, q, keys, values, mask, scaling=self.scaling, s_aux=self.sinks)
        out = out.reshape(b, n, hq * d)
        return self.o_proj(out if out.dtype == x.dtype else out.to(x.dtype))


class LeanDecoder:
    """The decoder stack of a supported Hugging Face model (see the module docstring), built once per model.

    Args:
        model: a ``*ForCausalLM`` whose :func:`_unsupported` reason is ``None``.
    """

    def __init__(self, model: Any) -> None:
        base = model.model
        self.model = model
        self.embed = base.embed_tokens
        self.rotary = base.rotary_emb
        self.final_norm = _Norm(base.norm)
        self.layers = list(base.layers)
        self.norms = [(_Norm(layer.input_layernorm), _Norm(layer.post_attention_layernorm)) for layer in self.layers]
        cfg = model.config
        self.layer_types = list(getattr(cfg, "layer_types", None) or [])
        self.attention = [_Attention(layer.self_attn, cfg) for layer in self.layers]
        head = model.get_output_embeddings()
        self.lm_head = linear.FusedLinear([head], keep_float=True) if isinstance(head, torch.nn.Linear) else head
        self.reduced = linear.reduced_cpu(self.embed.weight)
        self._rope = RopeTables(self.rotary, self.attention[0].head_dim)

    @classmethod
    def build(cls, model: Any) -> LeanDecoder | None:
        """A lean decoder for ``model``, or ``None`` (logged) where the model's own forward must run."""
        reason = _unsupported(model)
        if reason is not None:
            logger.info("lean decoding path off for %s: %s", type(model).__name__, reason)
            return None
        return cls(model)

    def _rotary(self, h: torch.Tensor, positions: torch.Tensor,
                bound: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` ``[B, 1, N, D]`` for :func:`specmoe.models.rope.rotate` (see
        :class:`~specmoe.models.rope.RopeTables`; ``bound``: every position is below it)."""
        return self._rope(h, positions, bound)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` final hidden states -> ``[..., V]`` float32 logits (the model's LM head)."""
        return self.lm_head(hidden).float()

    def _mlp(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        """The model's own MLP module on ``x``. Reduced precision on a CPU, up to :data:`NATIVE_ROWS` rows:
        with oneDNN off, so the router's projection takes torch's own kernel (4 against 17 us for the demo's
        32 x 256 router; each row's result the same whatever the number of rows), as the experts' single rows
        already do (:mod:`specmoe_plugins.verifiers.union.reference`)."""
        if not self.reduced or x.numel() > NATIVE_ROWS * x.shape[-1] or not torch.backends.mkldnn.enabled:
            m = layer.mlp(x)
        else:
            torch.backends.mkldnn.enabled = False
            try:
                m = layer.mlp(x)
            finally:
                torch.backends.mkldnn.enabled = True
        return m[0] if isinstance(m, tuple) else m

    def _mask(self, masks: Any, i: int) -> torch.Tensor | None:
        if isinstance(masks, dict):
            return masks[self.layer_types[i]]
        return masks

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: Any, masks: Any,
                 hidden_layers: Sequence[int] = ()) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """One pass over ``N`` new tokens.

        Args:
            input_ids: ``[B, N]`` int64.
            positions: ``[B, N]`` absolute positions.
            cache: a ``transformers`` cache (``update(k, v, layer_idx)``); the new keys / values are appended.
            masks: additive float ``[B, 1, N, S + N]`` mask, or ``{layer type: mask}`` (as the model takes it).
            hidden_layers: which entries of the model's ``hidden_states`` tuple the caller needs (0 =
                embeddings, ``i + 1`` = output of layer ``i``, the last = final normalized state); none: no
                tuple is kept.

        Returns:
            ``(final normalized hidden [B, N, H], hidden_states list or None)``.
        """
        h = self.embed(input_ids)
        # a token's position never exceeds its cache slot (positions count a row's committed tokens), so the
        # cached slots plus the new tokens bound them without reading ``positions``
        cached = _cached_slots(cache)
        cos, sin = self._rotary(h, positions, None if cached is None else cached + input_ids.shape[1])
        keep = bool(hidden_layers)
        states = [h] if keep else None
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            a = self.attention[i](self.norms[i][0](h), cos, sin, cache, i, self._mask(masks, i))
            h = h + a
            h = h + self._mlp(layer, self.norms[i][1](h))
            if keep and i < last:
                states.append(h)
        h = self.final_norm(h)
        if keep:
            states.append(h)
        return h, states
