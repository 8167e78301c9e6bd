# SPDX-License-Identifier: Apache-2.0
"""``specmoe_gqa``: attention for Hugging Face models that reads each key/value head once.

``transformers``' ``eager`` attention materialises ``repeat_kv`` (every KV head copied once per query head of its
group) over the whole cache in every layer and step. Here the query heads that share a KV head are stacked along
the query axis instead (``[B, H_kv, rep * N, D]``), so keys and values are read in place (a view of the
in-place cache, no copy):

* models without attention sinks: ``scaled_dot_product_attention`` on the grouped queries, the (small)
  ``[B, 1, N, S]`` mask tiled over the group;
* GPT-OSS (learned per-head sinks ``s_aux``): the softmax gets one more logit per head that takes probability
  mass and contributes no value, so the output is the sink-free attention times ``Z / (Z + exp(sink))``, with
  ``Z`` the sum of the exponentiated scores: ``sigmoid(logsumexp - sink)``. On CPUs torch's flash-attention
  kernel (the one ``scaled_dot_product_attention`` runs there) returns that log-sum-exp, so in bf16 / fp16 this
  path is that kernel on the grouped queries and one rescale (fp32 accumulation; measured on the demo's decoding
  shapes, one thread, 512 cached tokens: 39 µs per layer in bf16 against 58 µs for the explicit path below).
  Float32 keeps the explicit path (flash would save ~8 µs per layer, but its result for a row depends on how
  many query rows the pass has, see ``_FLASH_DTYPES``), as do GPUs and a torch without that kernel: the grouped
  scores come from one batched matmul, the sink-augmented softmax runs in float32 and the output from one more
  batched matmul (still no repeated KV heads; the scores are ``N x S`` per head, small during decoding).
  Measured on the demo's shapes (CPU, 512-4096 cached tokens): 1.5-10x faster than eager.

Masks are the model's own additive float masks (``eager``'s mask builder is registered under the same name), or
the 4D tree masks the targets pass. The math is eager's (same masks, same sink softmax); the order of floating
point operations differs, so results match eager to rounding (tested), and every path of a target (speculative
verification, autoregressive reference, ``generate``) uses this same function.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ATTN_IMPLEMENTATION", "grouped_attention", "register"]

#: the name to load models with (``attn_implementation=ATTN_IMPLEMENTATION``) after :func:`register`
ATTN_IMPLEMENTATION = "specmoe_gqa"


def _group_mask(mask: torch.Tensor | None, b: int, hkv: int, rep: int, n: int, s: int,
                dtype: torch.dtype) -> torch.Tensor | None:
    """``[B, 1 | H, N, >= S]`` bool or additive mask -> additive ``[B, 1 | H_kv, 1 | rep, N, S]``."""
    if mask is None:
        return None
    if mask.shape[-1] != s:
        mask = mask[..., :s]
    if mask.dtype == torch.bool:
        mask = torch.where(mask, torch.zeros((), dtype=dtype, device=mask.device), torch.finfo(dtype).min)
    if mask.shape[1] == 1:
        return mask[:, :, None]
    return mask.view(b, hkv, rep, n, s)


#: dtypes whose CPU sink attention takes the flash kernel; float32 keeps the explicit path, whose per-row
#: arithmetic does not depend on how many query rows a pass has (the flash kernel's blocking does: a row
#: verified with three others can differ in the last bit from the same row decoded alone)
_FLASH_DTYPES = (torch.bfloat16, torch.float16)


def _flash_cpu() -> Any:
    """torch's CPU flash-attention op (``(out, logsumexp, ...)``), or ``None`` in a build without it."""
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _sink_attention_cpu(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                        sinks: torch.Tensor, scale: float, b: int, hkv: int, rep: int, n: int, s: int) -> torch.Tensor:
    """Sink attention from the flash kernel's output and log-sum-exp: ``[B, H_kv, rep * N, D_v]``."""
    if mask is not None:
        mask = mask.expand(b, mask.shape[1], rep, n, s).reshape(b, mask.shape[1], rep * n, s)
    out, lse = _flash_cpu()(q, key, value, attn_mask=mask, scale=scale)[:2]
    sink = sinks.float().view(1, hkv, rep, 1).expand(b, hkv, rep, n).reshape(b, hkv, rep * n)
    keep = torch.sigmoid(lse.float() - sink)  # Z / (Z + exp(sink)): the mass the sink leaves to the keys
    if out.dtype == torch.float32:
        return out * keep[..., None]
    return (out.float() * keep[..., None]).to(out.dtype)


def grouped_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      s_aux: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The ``transformers`` attention-function contract.

    Args:
        module: the attention module (only read for ``sinks`` when ``s_aux`` is not passed).
        query: ``[B, H, N, D]``; key: ``[B, H_kv, S, D]``; value: ``[B, H_kv, S, D_v]``.
        attention_mask: additive float or bool ``[B, 1 | H, N, S]`` (the window of sliding layers is in it), or
            ``None`` (no masking, as eager).
        scaling: softmax scale (default ``D ** -0.5``).
        s_aux: ``[H]`` attention-sink logits (GPT-OSS).

    Returns:
        ``([B, N, H, D_v], None)``.
    """
    b, hq, n, d = query.shape
    hkv, s, dv = key.shape[1], key.shape[2], value.shape[-1]
    rep = hq // hkv
    scale = scaling if scaling is not None else d ** -0.5
    sinks = s_aux if s_aux is not None else getattr(module, "sinks", None)
    q = query.reshape(b, hkv, rep * n, d)  # heads of one group stacked along the query axis
    if sinks is None:
        mask = _group_mask(attention_mask, b, hkv, rep, n, s, query.dtype)
        if mask is not None and rep > 1:
            mask = mask.expand(b, mask.shape[1], rep, n, s).reshape(b, mask.shape[1], rep * n, s)
        elif mask is not None:
            mask = mask.squeeze(2)
        out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scale)
    elif query.device.type == "cpu" and query.dtype in _FLASH_DTYPES and _flash_cpu() is not None:
        mask = _group_mask(attention_mask, b, hkv, rep, n, s, query.dtype)
        out = _sink_attention_cpu(q, key, value, mask, sinks, scale, b, hkv, rep, n, s)
    else:
        # [B * H_kv, rep * N, S] scores with one batched matmul over the cache in place (a view, no copy)
        scores = torch.bmm((q * scale).reshape(b * hkv, rep * n, d), key.reshape(b * hkv, s, d).transpose(1, 2))
        scores = scores.view(b, hkv, rep, n, s)
        mask = _group_mask(attention_mask, b, hkv, rep, n, s, scores.dtype)
        if mask is not None:
            scores = scores + mask
        sink = sinks.to(scores.dtype).view(1, hkv, rep, 1, 1).expand(b, hkv, rep, n, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1, dtype=torch.float32)[..., :s]
        out = torch.bmm(probs.reshape(b * hkv, rep * n, s).to(value.dtype), value.reshape(b * hkv, s, dv))
    return out.view(b, hq, n, dv).transpose(1, 2).contiguous(), None


def register() -> str:
    """Register :func:`grouped_attention` (and eager's additive mask builder) with ``transformers``; returns
    the name. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, grouped_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, eager_mask)
    return ATTN_IMPLEMENTATION
