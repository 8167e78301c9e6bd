# SPDX-License-Identifier: Apache-2.0
"""The EAGLE-3 draft network (one Llama-style decoder layer over ``[embedding, hidden]``) and its config.

Module and parameter names are those of the released checkpoints (EAGLE ``cnets.py``, SpecForge
``LlamaForCausalLMEagle3``), so ``state_dict()`` *is* the checkpoint layout::

    embed_tokens.weight [V, H]      frozen; usually the target's own embedding
    fc.weight [H, k * H_t]          fuses the k (usually 3) captured target hidden states
    midlayer.{hidden_norm, input_layernorm, post_attention_layernorm}.weight [H]
    midlayer.self_attn.{q,k,v}_proj.weight [*, 2H]   o_proj.weight [H, heads * head_dim]
    midlayer.mlp.{gate,up,down}_proj.weight
    norm.weight [H]                 lm_head.weight [V_draft, H]
    d2t [V_draft] int64 (target id = i + d2t[i])    t2d [V] bool

One step: ``x = [input_layernorm(embed(token)), hidden_norm(h)]`` (embedding first), attention over ``x``
plus residual ``h``, MLP with residual; the pre-norm output is the next step's ``h`` and
``lm_head(norm(.))`` gives draft-vocabulary logits. Step 0 takes ``h = fc(target features)``.

Attention is left to the caller (:meth:`Eagle3Model.qkv` / :meth:`Eagle3Model.finish`) so that inference (a KV
cache plus tree masks) and training (the training-time-test diagonal attention) share every weight op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Optional

import torch
from torch import nn

from specmoe.errors import UserError
from specmoe.models.linear import FusedLinear
from specmoe.models.rope import RopeTables, rotate

__all__ = ["ARCHITECTURE", "Eagle3Config", "Eagle3Model", "RMSNorm", "attend", "capture_indices",
           "default_aux_layer_ids"]

#: architecture name written to config.json (SpecForge / SGLang / vLLM)
ARCHITECTURE = "LlamaForCausalLMEagle3"


def default_aux_layer_ids(num_target_layers: int) -> list[int]:
    """Distinct hidden-state boundaries to fuse for a target of ``num_target_layers`` (L) decoder layers.

    The serving engines' default ``[2, L // 2, L - 3]`` (EAGLE, vLLM, SGLang) where those are distinct
    (``L >= 7``); for shallower targets, where it repeats a layer (``[2, 2, 1]`` for 4 layers), three
    boundaries spread evenly over the inputs of layers ``1 .. L - 1`` (``[1, 2, 3]`` for 4 layers, ``[1, 3, 5]``
    for 6), or ``0 .. L - 1`` (the embeddings included: ``[0, 1, 2]`` for 3 layers; fewer than three for
    ``L < 3``). Boundary ``L`` (the last layer's output) is never chosen: the engines capture it before the
    final norm, ``transformers``' ``hidden_states[L]`` after it.
    """
    n = int(num_target_layers)
    engines = [2, n // 2, n - 3]
    if 0 < engines[0] < engines[1] < engines[2] < n:
        return engines
    pool = list(range(1, n)) if n >= 4 else list(range(0, max(n, 1)))
    if len(pool) <= 3:
        return pool
    return [pool[round(j * (len(pool) - 1) / 2)] for j in range(3)]


def capture_indices(aux_layer_ids: Optional[list[int]], num_target_layers: int) -> list[int]:
    """Target ``hidden_states`` indices (0 = embeddings, ``k`` = output of the first ``k`` decoder layers, i.e.
    the input of layer ``k``) feeding ``fc``, one per fc chunk, in chunk order.

    ``eagle_aux_hidden_state_layer_ids`` are read in the serving engines' convention: hidden-state boundary
    indices, captured as they are (vLLM's ``aux_hidden_state_layers``, every model; SGLang's GPT-OSS).
    Captures are concatenated in layer order, as the engines collect them while walking the layers.
    Without ids: the engines' default ``[2, L // 2, L - 3]`` (three fc chunks, as a released draft without
    ids has). Repeated ids occur only in drafts exported before this convention (read by
    :func:`~specmoe_plugins.drafters.eagle3.checkpoint.read_config`); their fc chunks then read the same
    hidden state, as they were trained.
    """
    n = int(num_target_layers)
    if aux_layer_ids is None:
        return sorted(min(max(i, 0), n) for i in (2, n // 2, n - 3))
    bad = [int(i) for i in aux_layer_ids if not 0 <= int(i) <= n]
    if bad:
        raise UserError(f"EAGLE-3 draft eagle_aux_hidden_state_layer_ids {list(aux_layer_ids)}: {bad} outside "
                        f"0..{n} (hidden-state boundaries of this {n}-layer target: 0 = embeddings, {n} = the "
                        f"last layer's output). Use a draft trained for this target.")
    return sorted(int(i) for i in aux_layer_ids)


@dataclass
class Eagle3Config:
    """The fields of an EAGLE-3 ``config.json`` the network needs; everything else is kept in ``raw``."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    """the target's vocabulary (rows of ``embed_tokens``, length of ``t2d``)."""
    draft_vocab_size: int
    head_dim: Optional[int] = None
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    target_hidden_size: Optional[int] = None
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict[str, Any]] = None
    aux_layer_ids: Optional[list[int]] = None
    """``eagle_config.eagle_aux_hidden_state_layer_ids``: the target hidden-state boundaries fused by ``fc``, one
    per chunk (:func:`capture_indices`; None: the serving engines' default)."""
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_before_residual: bool = False
    """vLLM flag: the residual is ``hidden_norm(h)`` instead of ``h``."""
    torch_dtype: str = "bfloat16"
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    """the config.json it was read from (unknown keys are written back unchanged)."""

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @property
    def fused_size(self) -> int:
        """Width of the captured target features: one target hidden size per aux layer id (3 without ids)."""
        chunks = len(self.aux_layer_ids) if self.aux_layer_ids else 3
        return chunks * (self.target_hidden_size or self.hidden_size)

    # ------------------------------------------------------------------ config.json
    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "config.json") -> Eagle3Config:
        """Parse EAGLE-3 ``config.json`` (SpecForge, EAGLE, or transformers-5 ``rope_parameters`` style)."""
        if int(d.get("num_hidden_layers", 1)) != 1:
            raise UserError(f"{where}: num_hidden_layers={d['num_hidden_layers']}; only one-layer EAGLE-3 "
                            f"drafts are supported")
        for flag in ("fc_norm", "norm_output"):
            if d.get(flag):
                raise UserError(f"{where}: '{flag}: true' drafts are not supported by this loader")
        eagle = d.get("eagle_config") or {}
        if eagle.get("use_aux_hidden_state") is False:
            raise UserError(f"{where}: eagle_config.use_aux_hidden_state=false (EAGLE-1/2 style) is not "
                            f"supported")
        missing = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
                   if k not in d]
        if missing:
            raise UserError(f"{where}: missing field(s) {', '.join(missing)}; is this an EAGLE-3 draft "
                            f"config?")
        theta, scaling = d.get("rope_theta"), d.get("rope_scaling")
        rp = d.get("rope_parameters")
        if theta is None and isinstance(rp, dict):
            theta = rp.get("rope_theta")
            if rp.get("rope_type", "default") != "default":
                scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        return cls(
            hidden_size=int(d["hidden_size"]), intermediate_size=int(d["intermediate_size"]),
            num_attention_heads=int(d["num_attention_heads"]),
            num_key_value_heads=int(d.get("num_key_value_heads") or d["num_attention_heads"]),
            vocab_size=int(d["vocab_size"]),
            draft_vocab_size=int(d.get("draft_vocab_size") or d["vocab_size"]),
            head_dim=d.get("head_dim"), rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            hidden_act=str(d.get("hidden_act", "silu")), target_hidden_size=d.get("target_hidden_size"),
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            rope_theta=float(theta if theta is not None else 10000.0), rope_scaling=scaling,
            aux_layer_ids=[int(i) for i in ids] if ids is not None else None,
            attention_bias=bool(d.get("attention_bias", False)), mlp_bias=bool(d.get("mlp_bias", False)),
            norm_before_residual=bool(d.get("norm_before_residual", False)),
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "bfloat16"), raw=dict(d))

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` to write: ``raw`` with every known field set to the current value."""
        out = dict(self.raw)
        out.setdefault("architectures", [ARCHITECTURE])
        out.setdefault("model_type", "llama")
        out.update(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                   num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                   num_hidden_layers=1, rms_norm_eps=self.rms_norm_eps,
                   hidden_act=self.hidden_act, vocab_size=self.vocab_size,
                   draft_vocab_size=self.draft_vocab_size,
                   max_position_embeddings=self.max_position_embeddings, torch_dtype=self.torch_dtype)
        out.setdefault("tie_word_embeddings", False)
        if "head_dim" in out or self.head_dim != self.hidden_size // self.num_attention_heads:
            out["head_dim"] = self.head_dim
        if "rope_parameters" in out and "rope_theta" not in out:
            rp = {"rope_theta": self.rope_theta, **(self.rope_scaling or {"rope_type": "default"})}
            out["rope_parameters"] = rp
        else:
            out["rope_theta"] = self.rope_theta
            if self.rope_scaling is not None or "rope_scaling" in out:
                out["rope_scaling"] = self.rope_scaling
        if "dtype" in out:
            out["dtype"] = self.torch_dtype
        if self.target_hidden_size is not None:
            out["target_hidden_size"] = self.target_hidden_size
        if self.aux_layer_ids is not None or "eagle_config" in out:
            eagle = dict(out.get("eagle_config") or {})
            if self.aux_layer_ids is not None:
                eagle["eagle_aux_hidden_state_layer_ids"] = list(self.aux_layer_ids)
            out["eagle_config"] = eagle
        for flag in ("attention_bias", "mlp_bias", "norm_before_residual"):
            if getattr(self, flag) or flag in out:
                out[flag] = getattr(self, flag)
        return out

    def replace(self, **changes: Any) -> Eagle3Config:
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        kw.update(changes)
        return Eagle3Config(**kw)

    def llama_config(self):
        """A ``transformers.LlamaConfig`` carrying the rotary settings (for ``LlamaRotaryEmbedding``)."""
        from transformers import LlamaConfig

        return LlamaConfig(hidden_size=self.hidden_size, num_attention_heads=self.num_attention_heads,
                           head_dim=self.head_dim, max_position_embeddings=self.max_position_embeddings,
                           rope_theta=self.rope_theta, rope_scaling=self.rope_scaling)


class RMSNorm(nn.Module):
    """Llama RMSNorm (computed in float32)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms(self, x)


def _rms(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` without the module call (inference passes call it directly)."""
    dt = x.dtype
    x = x if dt == torch.float32 else x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
    return norm.weight * (x if dt == torch.float32 else x.to(dt))


class _Attention(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        h2, hd = 2 * c.hidden_size, c.head_dim
        self.q_proj = nn.Linear(h2, c.num_attention_heads * hd, bias=c.attention_bias)
        self.k_proj = nn.Linear(h2, c.num_key_value_heads * hd, bias=c.attention_bias)
        self.v_proj = nn.Linear(h2, c.num_key_value_heads * hd, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_attention_heads * hd, c.hidden_size, bias=c.attention_bias)


class _MLP(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)
        self.act = ACT2FN[c.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class _InferenceParts:
    """The draft's inference projections and norms, gathered once (no submodule lookups or module calls per
    pass). Each projection is a :class:`~specmoe.models.linear.FusedLinear` over the model's own layers (rebuilt
    when a weight changes; not parameters: ``state_dict`` is unchanged). A draft's rounding never decides what
    is committed (verification does), so they take the fastest route for any row count
    (``row_invariant=False``)."""

    def __init__(self, m: "Eagle3Model") -> None:
        layer, att, mlp = m.midlayer, m.midlayer.self_attn, m.midlayer.mlp
        fused = lambda layers, keep_float=False: FusedLinear(layers, keep_float=keep_float, row_invariant=False)
        self.fc = fused([m.fc])
        self.qkv = fused([att.q_proj, att.k_proj, att.v_proj])
        self.o = fused([att.o_proj])
        self.gate_up = fused([mlp.gate_proj, mlp.up_proj])
        self.down = fused([mlp.down_proj])
        self.lm_head = fused([m.lm_head], keep_float=True)
        self.embed, self.act = m.embed_tokens, mlp.act
        self.hidden_norm, self.input_norm = layer.hidden_norm, layer.input_layernorm
        self.post_norm, self.norm = layer.post_attention_layernorm, m.norm


class _MidLayer(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = _Attention(c)
        self.mlp = _MLP(c)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Masked attention with grouped KV heads, reading each KV head once (the query heads of a group are
    stacked along the query axis; no repeated keys / values are materialised).

    Args:
        q: ``[B, Hq, N, D]``; k, v: ``[B, Hkv, S, D]``.
        allowed: ``[B, N, S]`` bool; every query row must allow at least one key.

    Returns:
        ``[B, Hq, N, D]``.
    """
    b, hq, n, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    rep = hq // hkv
    mask = allowed[:, None]
    if rep > 1:
        q = q.reshape(b, hkv, rep * n, d)
        mask = mask[:, :, None].expand(b, 1, rep, n, s).reshape(b, 1, rep * n, s)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.reshape(b, hq, n, v.shape[-1])  # a CUDA kernel may return a non-contiguous result


class Eagle3Model(nn.Module):
    """The draft network; see the module docstring for names and the step computation."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(c.fused_size, c.hidden_size, bias=False)
        self.midlayer = _MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        if c.draft_vocab_size <= c.vocab_size:
            self.t2d[: c.draft_vocab_size] = True
        self.rotary = LlamaRotaryEmbedding(c.llama_config())
        self.scale = 1.0 / math.sqrt(c.head_dim)
        self._rope_tables: RopeTables | None = None

    def _parts(self) -> _InferenceParts:
        parts = self.__dict__.get("_inference_parts")
        if parts is None:
            parts = self.__dict__["_inference_parts"] = _InferenceParts(self)
        return parts

    # ------------------------------------------------------------------ pieces of one step
    def project(self, features: torch.Tensor) -> torch.Tensor:
        """``[..., k H_t]`` target features (k aux layers) -> ``[..., H]`` step-0 hidden (``fc``); ``[..., H]``
        passes."""
        if features.shape[-1] == self.config.hidden_size:
            return features
        fc = self.fc if torch.is_grad_enabled() else self._parts().fc
        return fc(features.to(self.fc.weight.dtype))

    def qkv(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, bound: int | None = None):
        """Queries, keys, values (RoPE applied) and the residual of one step.

        Args:
            tokens: ``[B, N]`` target-vocabulary ids; hidden: ``[B, N, H]``; positions: ``[B, N]``.
            bound: every position is below it (host-known: the cached slots plus ``N``; a position never exceeds
                its slot), so the inference rotary tables read nothing back (``None``: read on CPUs).

        Returns:
            ``q [B, Hq, N, D]``, ``k, v [B, Hkv, N, D]``, ``residual [B, N, H]``.
        """
        c = self.config
        hq, hkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        train = torch.is_grad_enabled()
        if train:
            layer = self.midlayer
            emb = self.embed_tokens(tokens).to(hidden.dtype)
            h_norm = layer.hidden_norm(hidden)
            x = torch.cat([layer.input_layernorm(emb), h_norm], dim=-1)
            att = layer.self_attn
            q, k, v = att.q_proj(x), att.k_proj(x), att.v_proj(x)
        else:  # the same operations without module calls; one product over the three projections' weights
            p = self._parts()
            emb = nn.functional.embedding(tokens, p.embed.weight)
            h_norm = _rms(p.hidden_norm, hidden)
            x = torch.cat([_rms(p.input_norm, emb if emb.dtype == hidden.dtype else emb.to(hidden.dtype)), h_norm],
                          dim=-1)
            q, k, v = p.qkv(x).split([hq * d, hkv * d, hkv * d], dim=-1)
        residual = h_norm if c.norm_before_residual else hidden
        b, n, _ = x.shape
        q = q.reshape(b, n, hq, d).transpose(1, 2)
        k = k.reshape(b, n, hkv, d).transpose(1, 2)
        v = v.reshape(b, n, hkv, d).transpose(1, 2)
        if train:
            cos, sin = self.rotary(x, positions)
            cos, sin = cos[:, None], sin[:, None]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        else:  # the rotary tables computed once (the same values and products, fewer operations per step)
            tables = self._rope_tables
            if tables is None or tables.rotary is not self.rotary:  # the loader may swap in the checkpoint's rotary
                tables = self._rope_tables = RopeTables(self.rotary, self.config.head_dim)
            cos, sin = tables(x, positions, bound)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        return q, k, v, residual

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``attn [B, Hq, N, D]`` -> the step output ``[B, N, H]`` (pre-norm; the next step's hidden)."""
        b, _, n, _ = attn.shape
        flat = attn.transpose(1, 2).reshape(b, n, -1)
        if torch.is_grad_enabled():
            layer = self.midlayer
            h = residual + layer.self_attn.o_proj(flat)
            return h + layer.mlp(layer.post_attention_layernorm(h))
        p = self._parts()
        h = residual + p.o(flat)
        gate, up = p.gate_up(_rms(p.post_norm, h)).chunk(2, dim=-1)
        return h + p.down(p.act(gate) * up)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` -> ``[..., V_draft]`` float32 draft-vocabulary logits."""
        if torch.is_grad_enabled():
            return self.lm_head(self.norm(hidden)).float()
        p = self._parts()
        return p.lm_head(_rms(p.norm, hidden)).float()

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             past_k: Optional[torch.Tensor], past_v: Optional[torch.Tensor], allowed: torch.Tensor):
        """One step of ``N`` new inputs attending to ``S`` cached keys and to each other.

        Args:
            allowed: ``[B, N, S + N]`` bool visibility (cached slots first).

        Returns:
            ``(out [B, N, H], k [B, Hkv, N, D], v [B, Hkv, N, D])`` -- the new keys/values to cache.
        """
        n_past = 0 if past_k is None else past_k.shape[2]
        q, k, v, residual = self.qkv(tokens, hidden, positions, n_past + tokens.shape[1])
        keys = k if past_k is None else torch.cat([past_k, k], dim=2)
        values = v if past_v is None else torch.cat([past_v, v], dim=2)
        return self.finish(attend(q, keys, values, allowed), residual), k, v

    def step_into(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                  cache_k: torch.Tensor, cache_v: torch.Tensor, start: int, allowed: torch.Tensor) -> torch.Tensor:
        """:meth:`step` over a preallocated cache: the ``N`` new keys / values are written in place at slots
        ``start .. start + N`` of ``cache_k, cache_v [B, Hkv, C, D]``, and the inputs attend to slots
        ``0 .. start + N`` (``allowed [B, N, start + N]``). Returns ``out [B, N, H]``."""
        q, k, v, residual = self.qkv(tokens, hidden, positions, start + tokens.shape[1])
        n = k.shape[2]
        cache_k.narrow(2, start, n).copy_(k)
        cache_v.narrow(2, start, n).copy_(v)
        keys, values = cache_k.narrow(2, 0, start + n), cache_v.narrow(2, 0, start + n)
        return self.finish(attend(q, keys, values, allowed), residual)

    def step_logp(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                  cache_k: torch.Tensor, cache_v: torch.Tensor, start: int,
                  allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`step_into` and the draft log-probabilities of every new input: ``(out [B, N, H],
        log-probabilities [B, N, V_draft] float32)``. Inference on a CPU runs it as one compiled function
        (:mod:`specmoe_plugins.drafters.eagle3.compiled`) where it can, for up to
        :data:`~specmoe_plugins.drafters.eagle3.compiled.COMPILED_MAX_ROWS` float32 inputs (``B * N``: a tree's
        expansion, a chain's step, a short catch-up; more, such as a prompt, take the eager step, whose BLAS
        products read each weight once for all rows) or
        :data:`~specmoe_plugins.drafters.eagle3.compiled.COMPILED_MAX_ROWS_REDUCED` bf16 / fp16 inputs."""
        compiled = self._compiled()
        if compiled is not None and not torch.is_grad_enabled() and tokens.numel() <= compiled.max_rows:
            got = compiled(tokens, hidden, positions, cache_k, cache_v, start, allowed)
            if got is not None:
                return got
        out = self.step_into(tokens, hidden, positions, cache_k, cache_v, start, allowed)
        return out, torch.log_softmax(self.logits(out), dim=-1)

    def _compiled(self) -> Any:
        """The compiled step (:class:`~specmoe_plugins.drafters.eagle3.compiled.CompiledStep`, built at the first
        call), or ``None`` where the eager step runs."""
        compiled = self.__dict__.get("_compiled_step", False)
        if compiled is False:
            from specmoe_plugins.drafters.eagle3.compiled import CompiledStep

            compiled = self.__dict__["_compiled_step"] = CompiledStep.build(self)
        return compiled

    def chain_logp(self, root_hidden: torch.Tensor, root_logp: torch.Tensor, root_pos: torch.Tensor,
                   cache_k: torch.Tensor, cache_v: torch.Tensor, context: torch.Tensor, steps: int,
                   top_k: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """A pool of frontier width one (``steps >= 2`` levels: the likeliest token at every depth and its
        ``top_k - 1`` runner-ups) in one compiled call: ``(tokens [B, steps, top_k]`` target ids, likeliest
        first, ``logp [B, steps, top_k]`` their edge log-probabilities, ``hidden [B, steps - 1, H]`` the outputs
        of the steps over the likeliest tokens of depths 1 .. steps - 1), their keys / values written after
        ``context [B, C]`` in ``cache_k, cache_v``; ``None`` where the compiled step does not run (the caller
        drafts level by level with :meth:`step_logp`)."""
        compiled = self._compiled()
        if compiled is None or torch.is_grad_enabled() or root_hidden.shape[0] > compiled.max_rows:
            return None
        return compiled.chain(root_hidden, root_logp, root_pos, cache_k, cache_v, context, steps, top_k)

    @torch.no_grad()
    def warm_up(self) -> None:
        """Run :meth:`step_logp` over one and over three inputs after three cached slots on a scratch cache
        (batch 1), and over one input more than the row kernels take where the compiled step still runs it: the
        compiled step's variants a decoding run takes (one input: a chain's step; several: absorbing the accepted
        tokens, a tree's level, a prompt) compile here rather than in the first
        drafts (a no-op for the eager step). Sizes of one would compile their own variants (a size-one dimension
        is a constant to the compiler): a scratch pass that attends to a single slot compiled one that no real
        step matched, and the first real steps compiled again (0.3-1 s each, inside a timed generation)."""
        if self.__dict__.get("_compiled_step", False) is None:
            return
        c, p = self.config, self.fc.weight
        start = 3
        for n in (1, 3, 0):  # a chain's step; absorbing the accepted tokens, a tree's level; (0) see below
            if n == 0:  # more inputs than the row kernels take, where the compiled step still runs them
                step = self.__dict__.get("_compiled_step")
                if step is None or not step.row or step.row_max >= step.max_rows:
                    break
                n = step.row_max + 1
            cache = torch.zeros(1, c.num_key_value_heads, 16 + n, c.head_dim, dtype=p.dtype, device=p.device)
            tokens = torch.zeros(1, n, dtype=torch.long, device=p.device)
            allowed = torch.ones(n, start + n, dtype=torch.bool, device=p.device).tril(start)[None]
            self.step_logp(tokens, torch.zeros(1, n, c.hidden_size, dtype=p.dtype, device=p.device),
                           torch.arange(start, start + n, device=p.device)[None], cache, cache.clone(), start,
                           allowed)

    # ------------------------------------------------------------------ vocabulary
    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (``i + d2t[i]``)."""
        return draft_ids + self.d2t[draft_ids]

    def target_to_draft(self) -> torch.Tensor:
        """``[V]`` int64: the draft id of each target id, ``-1`` where it is not in the draft vocabulary."""
        out = torch.full_like(self.t2d, -1, dtype=torch.long)
        used = self.d2t + torch.arange(self.d2t.numel(), device=self.d2t.device)
        out[used] = torch.arange(used.numel(), device=used.device)
        return out
