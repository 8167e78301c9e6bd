# SPDX-License-Identifier: Apache-2.0
"""The ``triton_union`` verifier's kernels (moved here from ``specmoe.kernels.union_moe``, now a deprecated
alias): expert-major, read-once Triton kernels for MoE experts over a small token count (``T <= 64``).

Design (``/work/shared/reference/moe-kernels.md`` section C):

1. metadata (:mod:`.routing_meta`, beside this module): slots grouped by expert, union list padded to
   ``U_max = min(E, T*K)``; no host sync, so the grid depends only on ``(T, K, E)``.
2. ``_gate_up_kernel``, grid ``(ceil(I / BN), U_max)``: one program per (intermediate N-tile, union
   expert) loads all of the expert's rows into one ``BLOCK_M >= T`` tile (padded with masked loads, so
   ``tl.dot`` sees M >= 16), streams ``H`` with gate and up accumulators, applies bias and activation in
   fp32 and stores ``h`` rows (weights dtype) into an ``[S, I]`` workspace in expert-sorted order. Every
   weight tile is read by exactly one program.
3. ``_down_kernel``, grid ``(ceil(H / BN), U_max)``: streams ``I``, adds the bias, multiplies by the
   routing weight in fp32 and writes one fp32 row ``Y[s]`` per slot (one writer per row, no atomics).
4. ``_reduce_kernel``, grid ``(ceil(H / BN), T)``: sums a token's ``K`` slots in a fixed order in fp32,
   skipping sentinel slots, and casts once. Bitwise deterministic.

The N-tile is the fastest-varying program id, so the programs of one expert run together and share ``x``
and ``h`` rows in L2. Expert base offsets use int64 arithmetic. Kernels are dtype-generic (fp32 / bf16 /
fp16 on a GPU; fp32 only under ``TRITON_INTERPRET=1`` on a CPU, where the interpreter corrupts bf16 dots).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specmoe.errors import UserError
from specmoe_plugins.verifiers.union.layout import ACT_SILU, ACT_SWIGLU_OAI, ExpertsLayout
from specmoe_plugins.verifiers.union.routing_meta import RoutingMeta, routing_meta

__all__ = ["UnionBlocks", "union_moe", "is_interpreted"]


@dataclass(frozen=True)
class UnionBlocks:
    """Tile sizes (clamped to the problem: at least 16, at most the next power of two of the dimension)."""

    block_n: int = 64
    """intermediate columns per gate_up program (GPT-OSS loads ``2 * block_n`` interleaved columns)."""
    block_k: int = 128
    """hidden-dimension step of the gate_up stream."""
    down_block_n: int = 64
    """output (hidden) columns per down program."""
    down_block_k: int = 128
    """intermediate-dimension step of the down stream."""
    reduce_block_n: int = 256
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, b_ptr, h_ptr, perm_ptr, u_expert_ptr, u_start_ptr, u_count_ptr,
                    top_k, hidden, inter, up_offset, stride_xt, stride_we, stride_wk, stride_wn, stride_be,
                    stride_hs, alpha, limit,
                    INTERLEAVED: tl.constexpr, SWIGLU_OAI: tl.constexpr, HAS_BIAS: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    DOT_PREC: tl.constexpr):
    pid_n = tl.program_id(0)
    u = tl.program_id(1)
    expert = tl.load(u_expert_ptr + u)
    if expert < 0:
        return
    start = tl.load(u_start_ptr + u)
    count = tl.load(u_count_ptr + u)
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < inter
    for m0 in range(0, count, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        m_mask = offs_m < count
        slot = tl.load(perm_ptr + start + offs_m, mask=m_mask, other=0)
        x_rows = x_ptr + (slot // top_k).to(tl.int64)[:, None] * stride_xt
        if INTERLEAVED:
            # one contiguous [BK, 2*BN] tile: columns 2n (gate) and 2n+1 (up)
            offs_c = pid_n * 2 * BLOCK_N + tl.arange(0, 2 * BLOCK_N)
            c_mask = offs_c < 2 * inter
            acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
            for k0 in range(0, hidden, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_mask = offs_k < hidden
                xa = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
                wb = tl.load(w_base + offs_k.to(tl.int64)[:, None] * stride_wk + offs_c[None, :] * stride_wn,
                             mask=k_mask[:, None] & c_mask[None, :], other=0.0, eviction_policy="evict_first")
                acc = tl.dot(xa.to(wb.dtype), wb, acc, input_precision=DOT_PREC)
            if HAS_BIAS:
                bias = tl.load(b_ptr + expert.to(tl.int64) * stride_be + offs_c, mask=c_mask, other=0.0)
                acc += bias.to(tl.float32)[None, :]
            gate, up = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
        else:
            acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, hidden, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                k_mask = offs_k < hidden
                xa = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
                w_tile = w_base + offs_k.to(tl.int64)[:, None] * stride_wk + offs_n[None, :] * stride_wn
                wmask = k_mask[:, None] & n_mask[None, :]
                wg = tl.load(w_tile, mask=wmask, other=0.0, eviction_policy="evict_first")
                wu = tl.load(w_tile + up_offset * stride_wn, mask=wmask, other=0.0,
                             eviction_policy="evict_first")
                xa = xa.to(wg.dtype)
                acc_g = tl.dot(xa, wg, acc_g, input_precision=DOT_PREC)
                acc_u = tl.dot(xa, wu, acc_u, input_precision=DOT_PREC)
            if HAS_BIAS:
                b_row = b_ptr + expert.to(tl.int64) * stride_be
                acc_g += tl.load(b_row + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
                acc_u += tl.load(b_row + up_offset + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            gate = acc_g
            up = acc_u
        if SWIGLU_OAI:
            gate = tl.minimum(gate, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
            act = (up + 1.0) * (gate * tl.sigmoid(gate * alpha))
        else:
            act = gate * tl.sigmoid(gate) * up
        h_rows = h_ptr + (start + offs_m).to(tl.int64)[:, None] * stride_hs
        tl.store(h_rows + offs_n[None, :], act.to(h_ptr.dtype.element_ty),
                 mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _down_kernel(h_ptr, w_ptr, b_ptr, y_ptr, rw_ptr, perm_ptr, u_expert_ptr, u_start_ptr, u_count_ptr,
                 hidden, inter, stride_hs, stride_we, stride_wk, stride_wn, stride_be, stride_ys,
                 HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 DOT_PREC: tl.constexpr):
    pid_n = tl.program_id(0)
    u = tl.program_id(1)
    expert = tl.load(u_expert_ptr + u)
    if expert < 0:
        return
    start = tl.load(u_start_ptr + u)
    count = tl.load(u_count_ptr + u)
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < hidden
    for m0 in range(0, count, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        m_mask = offs_m < count
        h_rows = h_ptr + (start + offs_m).to(tl.int64)[:, None] * stride_hs
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < inter
            ha = tl.load(h_rows + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            wb = tl.load(w_base + offs_k.to(tl.int64)[:, None] * stride_wk + offs_n[None, :] * stride_wn,
                         mask=k_mask[:, None] & n_mask[None, :], other=0.0, eviction_policy="evict_first")
            acc = tl.dot(ha.to(wb.dtype), wb, acc, input_precision=DOT_PREC)
        if HAS_BIAS:
            acc += tl.load(b_ptr + expert.to(tl.int64) * stride_be + offs_n, mask=n_mask,
                           other=0.0).to(tl.float32)[None, :]
        slot = tl.load(perm_ptr + start + offs_m, mask=m_mask, other=0)
        rw = tl.load(rw_ptr + slot, mask=m_mask, other=0.0).to(tl.float32)
        acc = acc * rw[:, None]
        y_rows = y_ptr + slot.to(tl.int64)[:, None] * stride_ys
        tl.store(y_rows + offs_n[None, :], acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _reduce_kernel(y_ptr, idx_ptr, out_ptr, num_experts, hidden, stride_ys, stride_ot,
                   TOP_K: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_n = tl.program_id(0)
    t = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < hidden
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        slot = t * TOP_K + j
        e = tl.load(idx_ptr + slot + tl.zeros_like(offs_n))  # the slot's expert id, broadcast over the tile
        valid = n_mask & (e >= 0) & (e < num_experts)
        acc += tl.load(y_ptr + slot.to(tl.int64) * stride_ys + offs_n, mask=valid, other=0.0)
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + offs_n, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


def is_interpreted() -> bool:
    """Whether these kernels were built for the Triton CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    return not isinstance(_gate_up_kernel, triton.runtime.JITFunction)


def _block(requested: int, dim: int) -> int:
    return max(16, min(triton.next_power_of_2(requested), triton.next_power_of_2(dim)))


def _strides(w: torch.Tensor, transposed: bool) -> tuple[int, int, int]:
    """``(expert, k, n)`` strides of a weight viewed as ``B[e, k (input), n (output)]``."""
    if transposed:
        return w.stride(0), w.stride(1), w.stride(2)
    return w.stride(0), w.stride(2), w.stride(1)


def _check_device(hidden: torch.Tensor, weight: torch.Tensor) -> None:
    if hidden.device != weight.device:
        raise UserError(f"triton_union: hidden states on {hidden.device} but expert weights on "
                        f"{weight.device}")
    interpreted = is_interpreted()
    if hidden.device.type == "cpu" and not interpreted:
        raise UserError("triton_union on a CPU tensor needs the Triton interpreter: set TRITON_INTERPRET=1 "
                        "in the environment before triton (the triton_union verifier's kernels) is imported, or use "
                        "'verifier: {name: torch_union}' on CPU")
    if interpreted and weight.dtype != torch.float32:
        raise UserError(f"triton_union under the Triton interpreter (TRITON_INTERPRET=1) supports float32 "
                        f"only (got {weight.dtype}; the interpreter corrupts bf16 dots): set target.dtype: "
                        f"float32, or unset TRITON_INTERPRET on a GPU machine")


def union_moe(module: object, layout: ExpertsLayout, hidden: torch.Tensor, top_k_index: torch.Tensor,
              top_k_weights: torch.Tensor, blocks: UnionBlocks = UnionBlocks()) -> torch.Tensor:
    """Union-aware experts: ``hidden [T, H]``, ``top_k_index [T, K]``, ``top_k_weights [T, K]`` -> ``[T, H]``.

    ``module`` holds ``gate_up_proj``, ``down_proj`` (and biases when ``layout.has_bias``). Ids outside
    ``[0, E)`` are skipped. The output dtype is ``hidden.dtype``.
    """
    if layout.activation not in (ACT_SILU, ACT_SWIGLU_OAI):
        raise UserError("triton_union implements SiLU-gated and GPT-OSS clamped-SwiGLU experts only: "
                        "use 'verifier: {name: torch_union}' for this model")
    _check_device(hidden, module.gate_up_proj)
    x = hidden.contiguous()
    idx = top_k_index.contiguous()
    rw = top_k_weights.reshape(-1).contiguous()
    meta = routing_meta(idx, layout.num_experts)
    out = torch.empty(idx.shape[0], layout.hidden, dtype=hidden.dtype, device=hidden.device)
    # triton launches on the current device: make it the tensors' one (models spread with device_map)
    with torch.cuda.device(hidden.device) if hidden.is_cuda else contextlib.nullcontext():
        _launch(module, layout, x, idx, rw, meta, out, blocks)
    return out


def _launch(module: object, layout: ExpertsLayout, x: torch.Tensor, idx: torch.Tensor, rw: torch.Tensor,
            meta: RoutingMeta, out: torch.Tensor, blocks: UnionBlocks) -> None:
    """Launch the three kernels on the current device (``out [T, H]`` is written)."""
    w_gu, w_d = module.gate_up_proj, module.down_proj
    t, k = idx.shape
    h_dim, i_dim = layout.hidden, layout.intermediate
    h_ws = torch.empty(t * k, i_dim, dtype=w_gu.dtype, device=x.device)
    y_ws = torch.empty(t * k, h_dim, dtype=torch.float32, device=x.device)
    block_m = max(16, triton.next_power_of_2(t))
    prec = "ieee" if w_gu.dtype == torch.float32 else "tf32"  # exact fp32 dots; ignored for 16-bit inputs
    b_gu = module.gate_up_proj_bias if layout.has_bias else w_gu
    b_d = module.down_proj_bias if layout.has_bias else w_d
    bn, bk = _block(blocks.block_n, i_dim), _block(blocks.block_k, h_dim)
    se, sk, sn = _strides(w_gu, layout.transposed)
    up_offset = 1 if layout.interleaved else i_dim
    _gate_up_kernel[(triton.cdiv(i_dim, bn), meta.u_max)](
        x, w_gu, b_gu, h_ws, meta.perm, meta.u_expert, meta.u_start, meta.u_count,
        k, h_dim, i_dim, up_offset, x.stride(0), se, sk, sn, b_gu.stride(0), h_ws.stride(0),
        layout.alpha, layout.limit if layout.limit != float("inf") else 3.0e38,
        INTERLEAVED=layout.interleaved, SWIGLU_OAI=layout.activation == ACT_SWIGLU_OAI,
        HAS_BIAS=layout.has_bias, BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, DOT_PREC=prec,
        num_warps=blocks.num_warps, num_stages=blocks.num_stages)
    dbn, dbk = _block(blocks.down_block_n, h_dim), _block(blocks.down_block_k, i_dim)
    se, sk, sn = _strides(w_d, layout.transposed)
    _down_kernel[(triton.cdiv(h_dim, dbn), meta.u_max)](
        h_ws, w_d, b_d, y_ws, rw, meta.perm, meta.u_expert, meta.u_start, meta.u_count,
        h_dim, i_dim, h_ws.stride(0), se, sk, sn, b_d.stride(0), y_ws.stride(0),
        HAS_BIAS=layout.has_bias, BLOCK_M=block_m, BLOCK_N=dbn, BLOCK_K=dbk, DOT_PREC=prec,
        num_warps=blocks.num_warps, num_stages=blocks.num_stages)
    rbn = _block(blocks.reduce_block_n, h_dim)
    _reduce_kernel[(triton.cdiv(h_dim, rbn), t)](
        y_ws, idx, out, layout.num_experts, h_dim, y_ws.stride(0), out.stride(0), TOP_K=k, BLOCK_N=rbn)
