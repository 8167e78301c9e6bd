# SPDX-License-Identifier: Apache-2.0
"""Expert-union-grouped MoE experts in plain PyTorch: the specification of the union kernels.

Per MoE layer call, the experts chosen by the ``T`` verified tokens form the union ``U``. The ``T * K``
(token, expert) slots are sorted by expert; each union expert is applied once, with one matmul per projection
over all of its slots (its weights are read once; experts outside the union are never touched), the outputs are
scaled by the routing weights in fp32 and added per token in ascending expert order, as the model's eager loop does;
the result is cast once.

Two ways to run the per-expert matmuls, same math:

* ``grouped``: ``torch.nn.functional.grouped_mm`` over the sorted slots with per-expert offsets: a fixed
  number of operations per layer whatever ``|U|``, no host synchronisation (CUDA-graph friendly);
* ``loop``: one matmul per union expert (needs the union on the host: one synchronisation per layer).

:func:`union_experts_forward` takes ``loop`` on CPUs and ``grouped`` on GPUs where this torch build runs
``grouped_mm`` for the weights' dtype (bfloat16 on compute capability >= 8.0), else ``loop``. On a CPU a host
synchronisation is free and torch's ``grouped_mm`` is itself a loop over *all* ``E`` experts (a matmul and a
host read per expert, empty or not): measured on the demo (one thread, 32 experts, a decoding step of one
token) ``loop`` saves ~0.3 ms per token.

The per-expert matmul of a float32 decoding step or verification pass on a CPU (at most :data:`FEW_SLOTS` slots)
runs on a packed copy of the expert weights in oneDNN's layout where that kernel gives each row the same result
whatever the number of rows (:func:`packed_experts`); otherwise, and for larger passes, in float32 the model's
own form (``x @ W`` for GPT-OSS, ``F.linear`` otherwise: bit-identical to its eager loop), in bf16 / fp16
``F.linear`` on output-major weights through :func:`specmoe.models.linear.linear` (a single row: torch's
matrix-vector kernel, not oneDNN's per-call overhead). GPT-OSS stores its experts input-major
(``[E, H, 2I]``); :func:`prepare` (called when the verifier is installed) re-stores a reduced-precision CPU
model's expert weights output-major in place: same values and shapes (a transposed view), so every other
implementation and ``save_pretrained`` see the same tensors.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from specmoe.interfaces.verifier import GraphExperts
from specmoe.kernels import row_kernels
from specmoe.models import linear
from specmoe_plugins.verifiers.union.layout import ACT_SILU, ACT_SWIGLU_OAI, ExpertsLayout, apply_gate, experts_layout

__all__ = ["union_experts_forward", "grouped_supported", "prepare", "packed_experts", "PACK_MAX_BYTES",
           "graph_experts"]


@functools.lru_cache(maxsize=None)
def grouped_supported(device_type: str, dtype: torch.dtype, capability: tuple[int, int] | None = None) -> bool:
    """Whether ``grouped_mm`` runs for weights of this device type and dtype (a one-off trial call)."""
    fn = getattr(torch.nn.functional, "grouped_mm", None)
    if fn is None or device_type not in ("cpu", "cuda"):
        return False
    if device_type == "cuda" and (dtype != torch.bfloat16 or capability is None or capability < (8, 0)):
        return False
    try:
        dev = torch.device(device_type)
        x = torch.ones(3, 16, device=dev, dtype=dtype)
        w = torch.ones(2, 16, 16, device=dev, dtype=dtype)
        out = fn(x, w, offs=torch.tensor([1, 3], device=dev, dtype=torch.int32))
        return bool(torch.allclose(out.float(), torch.full((3, 16), 16.0, device=dev)))
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def _layout(module: Any) -> ExpertsLayout:
    layout = getattr(module, "_specmoe_layout", None)
    if layout is None:
        layout = experts_layout(module)
        module._specmoe_layout = layout
    return layout


def _use_grouped(weight: torch.Tensor) -> bool:
    if weight.device.type == "cpu":
        return False
    cap = torch.cuda.get_device_capability(weight.device) if weight.device.type == "cuda" else None
    return grouped_supported(weight.device.type, weight.dtype, cap)


def _grouped(module: Any, layout: ExpertsLayout, x: torch.Tensor, key: torch.Tensor,
             offs: torch.Tensor) -> torch.Tensor:
    """``x [S, H]`` slot inputs sorted by expert (``key [S]`` their experts, ``E`` for sentinels at the tail),
    ``offs [E]`` int32 cumulative slot counts -> ``[S, H]`` expert outputs (sentinel rows: garbage)."""
    fn = torch.nn.functional.grouped_mm
    w_gu, w_d = module.gate_up_proj, module.down_proj
    if not layout.transposed:
        w_gu, w_d = w_gu.transpose(-2, -1), w_d.transpose(-2, -1)
    e = key.clamp(max=layout.num_experts - 1)
    h = fn(x.to(w_gu.dtype), w_gu, offs=offs)
    if layout.has_bias:
        h = h + module.gate_up_proj_bias[e]
    y = fn(apply_gate(module, layout, h), w_d, offs=offs)
    if layout.has_bias:
        y = y + module.down_proj_bias[e]
    return y


def _matmuls(x: torch.Tensor, weight: torch.Tensor, transposed: bool, counts: list[int]) -> torch.Tensor:
    """``x [S, in]`` slot rows sorted by expert (``counts``: rows per expert) times each row's expert weight
    (``weight [E, in, out]`` when ``transposed``, else ``[E, out, in]``) -> ``[S, out]``; one ``mm`` per union
    expert, written in place. The product is ``x @ W`` in the orientation the model's eager loop uses (``x @ W``
    / ``F.linear``), so float32 results are bit-identical to it. bf16 / fp16 rows on a CPU with the weight stored
    output-major each take torch's matrix-vector kernel (see :mod:`specmoe.models.linear`), one call per row: a
    matrix kernel over several rows rounds differently from the single row of an AR step (measured on the demo,
    bf16, AMD Zen 5: greedy chains equal to AR on 14 / 16 prompts with ``mm`` for groups of rows, 16 / 16 per
    row); the expert's weights are read from memory once and from cache for its further rows."""
    n_out = weight.shape[-1] if transposed else weight.shape[-2]
    out = torch.empty(x.shape[0], n_out, dtype=weight.dtype, device=x.device)
    # (a prompt pass, :func:`specmoe.models.linear.shared_pass`, takes a row block per call: no step rounds alike)
    reduced = x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16) and not linear.in_shared_pass()
    start = 0
    for expert, c in enumerate(counts):
        if not c:
            continue
        w = weight[expert] if transposed else weight[expert].t()  # [in, out]
        if reduced and w.stride(0) == 1:  # every row through the kernel an AR step's single row takes
            for r in range(start, start + c):
                linear.single_row_mm(x[r:r + 1], w, out[r:r + 1])
        else:
            torch.mm(x[start:start + c], w, out=out[start:start + c])
        start += c
    return out


def _loop(module: Any, layout: ExpertsLayout, x: torch.Tensor, key: torch.Tensor,
          counts: torch.Tensor) -> torch.Tensor:
    """As :func:`_grouped`, one matmul per union expert and projection (``counts [E]`` slots per expert); the
    biases and the activation are applied to all slots at once."""
    per = counts.tolist()
    e = key.clamp(max=layout.num_experts - 1)
    h = _matmuls(x.to(module.gate_up_proj.dtype), module.gate_up_proj, layout.transposed, per)
    if layout.has_bias:
        h = h + module.gate_up_proj_bias[e]
    y = _matmuls(apply_gate(module, layout, h), module.down_proj, layout.transposed, per)
    if layout.has_bias:
        y = y + module.down_proj_bias[e]
    return y


#: at most this many (token, expert) slots take :func:`_few` on CPUs (decoding steps and verification passes)
FEW_SLOTS = 64

#: CPU experts modules of at most this many weight bytes get a packed copy of their weights (:func:`packed_experts`)
PACK_MAX_BYTES = 256 << 20
_PACKS: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()


def _stamp(module: Any) -> tuple:
    names = ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias")
    return tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in
                 (getattr(module, n, None) for n in names) if t is not None)


def packed_experts(module: Any, layout: ExpertsLayout | None = None) -> tuple | None:
    """``module``'s float32 expert weights packed into oneDNN's layout, one ``(gate_up, down, gate_up_bias,
    down_bias)`` per expert, or ``None`` where they are not packed: not a float32 CPU module, trainable weights,
    oneDNN switched off, more than :data:`PACK_MAX_BYTES`, or a CPU whose packed kernel is unavailable or rounds
    a row differently with other rows beside it (:func:`specmoe.models.linear.packed_row_invariant`).

    bf16 / fp16 experts keep the single-row route of :func:`_matmuls` for every pass: the lean decoder runs a
    reduced-precision MLP of up to 8 rows with oneDNN off (its router), so a packed route would serve only the
    larger passes and round them unlike the AR steps; and packed it was no faster (demo, bf16, paired per prompt:
    ``ar`` 0.97-0.99x, chain of 3 1.00x).

    Why: a decoding step multiplies 1-16 rows by each union expert, weights mostly not in cache. torch's
    matmul streams such a weight at 11-20 GB/s (float32, falling with the rows; 7 GB/s for bf16), the packed
    kernel at 15-21 GB/s for 1-8 rows (13-14 GB/s of bf16, half the bytes). Measured on the demo's experts
    (256 x 768 and 384 x 256, 13 of 32 per layer over 4 layers, one thread, AMD EPYC Zen 5): 4 rows per expert
    5.75 -> 3.54 ms per pass in float32; end to end on the demo (6 GSM8K prompts, 96 tokens, paired per prompt)
    the float32 EAGLE-3 chain of 3 is ~5 % faster, ``ar`` unchanged (one row per expert: the same bytes either
    way). The copy is kept beside the model's weights (these stay what
    every other path and ``save_pretrained`` read) and rebuilt when a weight changes (storage or version
    counter)."""
    layout = layout or _layout(module)
    w_gu, w_d = module.gate_up_proj, module.down_proj
    if (w_gu.dtype != torch.float32 or w_gu.device.type != "cpu" or w_gu.requires_grad or w_d.requires_grad
            or not torch.backends.mkldnn.enabled
            or (w_gu.numel() + w_d.numel()) * w_gu.element_size() > PACK_MAX_BYTES):
        return None
    stamp = _stamp(module)
    cached = _PACKS.get(module)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    packs = None
    two_i, hid, inter = 2 * layout.intermediate, layout.hidden, layout.intermediate
    if linear.packed_row_invariant(w_gu.dtype, two_i, hid) and linear.packed_row_invariant(w_gu.dtype, hid, inter):
        packs = []
        split = _halves(layout)
        for e in range(layout.num_experts):
            gu = w_gu[e].detach()
            dn = w_d[e].detach()
            if layout.transposed:  # [in, out] -> [out, in]
                gu, dn = gu.t(), dn.t()
            b_gu = module.gate_up_proj_bias[e].detach() if layout.has_bias else None
            if split and layout.interleaved:  # gate outputs first, then up: each half one contiguous block
                gu = torch.cat([gu[0::2], gu[1::2]])
                b_gu = torch.cat([b_gu[0::2], b_gu[1::2]]) if b_gu is not None else None
            b_gu = b_gu.contiguous() if b_gu is not None else None
            b_d = module.down_proj_bias[e].detach().contiguous() if layout.has_bias else None
            packs.append((torch.ops.mkldnn._reorder_linear_weight(gu.contiguous(), linear.PACK_ROWS),
                          torch.ops.mkldnn._reorder_linear_weight(dn.contiguous(), linear.PACK_ROWS), b_gu, b_d))
        packs = tuple(packs)
    _PACKS[module] = (stamp, packs)
    return packs


def _halves(layout: ExpertsLayout) -> bool:
    """Whether the packed gate_up weights hold the gate outputs in ``[0, I)`` and the up outputs in ``[I, 2I)``
    (GPT-OSS interleaves them in its own weights; :func:`packed_experts` de-interleaves its copy, so the
    activation reads two contiguous halves; the values are the same)."""
    return layout.activation in (ACT_SWIGLU_OAI, ACT_SILU) or not layout.interleaved


def _packed_gate(module: Any, layout: ExpertsLayout, h: torch.Tensor) -> torch.Tensor:
    """:func:`specmoe_plugins.verifiers.union.layout.apply_gate` on the packed gate_up output ``h [M, 2I]`` (halves when
    :func:`_halves`): the same element-wise math."""
    if not _halves(layout):
        return apply_gate(module, layout, h)
    gate, up = h.split(layout.intermediate, dim=-1)
    if layout.activation == ACT_SWIGLU_OAI:
        gate = gate.clamp(max=layout.limit)
        up = up.clamp(min=-layout.limit, max=layout.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * layout.alpha))
    return module.act_fn(gate) * up


@functools.lru_cache(maxsize=4096)
def _index(order: tuple[int, ...]) -> torch.Tensor:
    """A CPU index tensor of ``order`` (kept: a decoding step's slot orders repeat)."""
    return torch.tensor(order, dtype=torch.long)


def _few_packed(module: Any, layout: ExpertsLayout, hidden: torch.Tensor, ids: list[list[int]],
                top_k_weights: torch.Tensor, packs: tuple) -> torch.Tensor:
    """:func:`_few` over the packed float32 weights: the same products, routing weights and additions in the
    same order and rounding, in fewer framework operations (a single token's row feeds each of its experts
    directly; each union expert's rows are one view of the gathered slots; index tensors are kept)."""
    t, k = len(ids), len(ids[0])
    flat = [e for row in ids for e in row]
    slots = tuple(sorted(range(t * k), key=flat.__getitem__))  # stable: ties keep slot order
    runs: list[list[int]] = []  # [expert, slots] in ascending expert id
    for s in slots:
        if runs and runs[-1][0] == flat[s]:
            runs[-1][1] += 1
        else:
            runs.append([flat[s], 1])
    x = hidden if hidden.dtype == torch.float32 else hidden.float()
    if t == 1:
        rows = [x] * len(runs)
    else:
        rows = x[_index(tuple(s // k for s in slots))].split([c for _, c in runs])
    h = [linear.packed_linear(r, packs[e][0], packs[e][2]) for (e, _), r in zip(runs, rows)]
    a = _packed_gate(module, layout, h[0] if len(h) == 1 else torch.cat(h))
    parts = a.split([c for _, c in runs]) if len(runs) > 1 else (a,)
    y = [linear.packed_linear(r, packs[e][1], packs[e][3]) for (e, _), r in zip(runs, parts)]
    return _combine(y[0] if len(y) == 1 else torch.cat(y), ids, slots, top_k_weights, layout.hidden, hidden.dtype)


def _combine(y: torch.Tensor, ids: list[list[int]], slots: tuple[int, ...], top_k_weights: torch.Tensor,
             hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """Slot outputs ``y [T * K, H]`` in ``slots`` order -> ``[T, H]``: each scaled by its routing weight in
    float32, a token's slots added in ascending expert id (as the model's eager loop), cast to ``dtype``."""
    t, k = len(ids), len(ids[0])
    w = top_k_weights.reshape(-1)
    w = w if w.dtype == torch.float32 else w.float()
    y = (y if y.dtype == torch.float32 else y.float()) * w[_index(slots)][:, None]
    if t > 1:  # per token, its slots in ascending expert id (their order in ``slots``)
        where = [0] * (t * k)
        for j, s in enumerate(slots):
            where[s] = j
        y = y[_index(tuple(where[i * k + j] for i in range(t) for j in sorted(range(k), key=ids[i].__getitem__)))]
    cols = y.view(t, k, hidden).unbind(1)
    acc = cols[0]
    for c in cols[1:]:
        acc = acc + c
    return acc if acc.dtype == dtype else acc.to(dtype)


def _row_weights(module: Any, layout: ExpertsLayout) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(gate_up [E, H, 2I], down [E, I, H])`` as ``[in, out]`` views when both are stored output-major
    (:func:`prepare`), i.e. when :func:`_matmuls` gives every reduced-precision CPU row torch's single-row
    kernel; else ``None``."""
    w_gu, w_d = module.gate_up_proj, module.down_proj
    if not layout.transposed:
        w_gu, w_d = w_gu.transpose(-2, -1), w_d.transpose(-2, -1)
    return (w_gu, w_d) if w_gu.stride(-2) == 1 and w_d.stride(-2) == 1 else None


def _few_rows(module: Any, layout: ExpertsLayout, hidden: torch.Tensor, ids: list[list[int]],
              top_k_weights: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """:func:`_few` for bf16 / fp16 experts on a CPU stored output-major: every slot's row through torch's
    single-row kernel (oneDNN off), as :func:`_matmuls` does, in fewer framework operations (a single token's
    row feeds each of its experts directly; one oneDNN switch per call; index tensors kept)."""
    t, k = len(ids), len(ids[0])
    flat = [e for row in ids for e in row]
    slots = tuple(sorted(range(t * k), key=flat.__getitem__))  # stable: ties keep slot order
    experts = [flat[s] for s in slots]
    w_gu, w_d = weights
    x = hidden if hidden.dtype == w_gu.dtype else hidden.to(w_gu.dtype)
    rows = [x] * (t * k) if t == 1 else x[_index(tuple(s // k for s in slots))].split(1)
    on = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        h = torch.cat([linear.single_row_mm(r, w_gu[e]) for r, e in zip(rows, experts)])
        if layout.has_bias:
            h = h + module.gate_up_proj_bias[_index(tuple(experts))]
        a = apply_gate(module, layout, h).split(1)
        y = torch.cat([linear.single_row_mm(r, w_d[e]) for r, e in zip(a, experts)])
    finally:
        torch.backends.mkldnn.enabled = on
    if layout.has_bias:
        y = y + module.down_proj_bias[_index(tuple(experts))]
    return _combine(y, ids, slots, top_k_weights, layout.hidden, hidden.dtype)


def _few(module: Any, layout: ExpertsLayout, hidden: torch.Tensor, ids: list[list[int]],
         top_k_weights: torch.Tensor) -> torch.Tensor:
    """:func:`union_experts_forward` of a few tokens on a CPU, with the grouping done on the host.

    The same products, in the same order and rounding as the sorted path below (slots grouped by expert in
    ascending id, stable in slot order; one matmul per union expert and projection; routing weights applied in
    float32; each token's experts added in ascending id), so a decoding step and a verification pass agree with
    each other and with :func:`_loop`. What it saves is the device-side bookkeeping (sort, counts, scatter and
    gathers: ~15 framework operations per layer, the larger part of a one-token step's experts time on the demo
    target). ``ids``: ``[T][K]`` expert ids, all in ``[0, E)``.
    """
    no_grad = not (torch.is_grad_enabled() and hidden.requires_grad)
    packs = packed_experts(module, layout) if no_grad else None
    if packs is not None:
        return _few_packed(module, layout, hidden, ids, top_k_weights, packs)
    if no_grad and module.gate_up_proj.dtype in (torch.bfloat16, torch.float16):
        weights = _row_weights(module, layout)
        if weights is not None:
            return _few_rows(module, layout, hidden, ids, top_k_weights, weights)
    t, k = len(ids), len(ids[0])
    flat = [e for row in ids for e in row]
    slots = sorted(range(t * k), key=flat.__getitem__)  # stable: ties keep slot order
    experts = [flat[s] for s in slots]
    counts = [0] * layout.num_experts
    for e in experts:
        counts[e] += 1
    dev = hidden.device
    slot_t = torch.tensor(slots, device=dev)
    x = hidden[slot_t // k]
    e_t = torch.tensor(experts, device=dev) if layout.has_bias else None
    h = _matmuls(x.to(module.gate_up_proj.dtype), module.gate_up_proj, layout.transposed, counts)
    if e_t is not None:
        h = h + module.gate_up_proj_bias[e_t]
    y = _matmuls(apply_gate(module, layout, h), module.down_proj, layout.transposed, counts)
    if e_t is not None:
        y = y + module.down_proj_bias[e_t]
    y = y.float() * top_k_weights.reshape(-1)[slot_t].float()[:, None]
    if t > 1:  # per token, its slots in ascending expert id (their order in ``slots``)
        where = [0] * (t * k)
        for j, s in enumerate(slots):
            where[s] = j
        order = [where[i * k + j] for i in range(t) for j in sorted(range(k), key=lambda j, i=i: ids[i][j])]
        y = y[torch.tensor(order, device=dev)]
    y = y.view(t, k, layout.hidden)
    acc = y[:, 0]
    for j in range(1, k):
        acc = acc + y[:, j]
    return acc.to(hidden.dtype)


def prepare(module: Any) -> bool:
    """Store a CPU bf16 / fp16 GPT-OSS-layout experts module's weights output-major (in place, same values and
    shapes: ``W`` becomes a transposed view of a contiguous ``W.T``), so that :func:`_project` takes ``F.linear``
    (see the module docstring). Returns whether anything was re-stored; idempotent; float32, GPUs, trainable
    weights and the output-major layouts are left alone."""
    layout = _layout(module)
    changed = False
    for name in ("gate_up_proj", "down_proj"):
        w = getattr(module, name)
        if (not layout.transposed or w.device.type != "cpu" or w.dtype == torch.float32 or w.requires_grad
                or w.transpose(-2, -1).is_contiguous()):
            continue
        w.data = w.data.transpose(-2, -1).contiguous().transpose(-2, -1)
        changed = True
    return changed


def union_experts_forward(module: Any, hidden: torch.Tensor, top_k_index: torch.Tensor,
                          top_k_weights: torch.Tensor, strategy: str | None = None) -> torch.Tensor:
    """Union-grouped experts computation.

    Args:
        module: a ``transformers`` experts module (GPT-OSS, Qwen3-MoE or DeepSeek-V3 layout).
        hidden: ``[T, H]`` MoE input.
        top_k_index: ``[T, K]`` int64 expert ids; rows need not be sorted; ids outside ``[0, E)`` (expert
            parallel sentinels, which carry weight 0) are skipped.
        top_k_weights: ``[T, K]`` routing weights (model dtype, or fp32 for DeepSeek-V3).
        strategy: ``grouped`` or ``loop`` (see the module docstring); ``None``: ``loop`` on CPUs, ``grouped``
            on GPUs where supported.

    Returns:
        ``[T, H]`` in ``hidden.dtype``.
    """
    layout = _layout(module)
    t, k = top_k_index.shape
    n_exp = layout.num_experts
    if strategy is None and hidden.device.type == "cpu" and 0 < t * k <= FEW_SLOTS:
        ids = top_k_index.tolist()
        if all(0 <= e < n_exp for row in ids for e in row):
            return _few(module, layout, hidden, ids, top_k_weights)
    flat = top_k_index.reshape(-1)
    # sentinels (and any id outside [0, E)) share the key E and sort last
    key = flat.clamp(max=n_exp)
    key = key.masked_fill(key < 0, n_exp)
    sorted_key, slots = torch.sort(key, stable=True)
    counts = torch.bincount(key, minlength=n_exp + 1)[:n_exp]
    x = hidden[slots // k]
    if strategy is None:
        strategy = "grouped" if _use_grouped(module.down_proj) else "loop"
    if strategy == "grouped":
        y = _grouped(module, layout, x, sorted_key, torch.cumsum(counts, 0, dtype=torch.int32))
    elif strategy == "loop":
        y = _loop(module, layout, x, sorted_key, counts)
    else:
        raise ValueError(f"union_experts_forward: strategy must be 'grouped' or 'loop', not {strategy!r}")
    real = (sorted_key < n_exp)[:, None]  # sentinel slots weigh 0 (their rows of y are not computed)
    y = torch.where(real, y.float() * top_k_weights.reshape(-1)[slots].float()[:, None], 0.0)
    out = torch.empty_like(y).index_copy_(0, slots, y).view(t, k, layout.hidden)  # back to (token, slot) order
    # each token's experts added one at a time in ascending expert id, as the model's own eager loop does
    # (index_add per expert from zero): in fp32 the result is bit-identical to eager
    order = key.view(t, k).argsort(dim=1, stable=True)
    out = out.gather(1, order[:, :, None].expand(t, k, layout.hidden))
    acc = out[:, 0]
    for j in range(1, k):
        acc = acc + out[:, j]
    return acc.to(hidden.dtype)


# ---------------------------------------------------------------------------------------------- graph form
@dataclass(frozen=True)
class _GraphLayout:
    """The constants of :func:`_graph_forward` (guarded by value when compiled)."""

    intermediate: int
    swiglu_oai: bool
    alpha: float
    limit: float
    kernel: bool = False
    """the slots' products by :mod:`specmoe.kernels.row_kernels` (input-major weights, :func:`_kernel_weights`)"""
    interleaved: bool = False
    """(kernel) gate and up outputs alternate in ``gate_up``'s columns, as GPT-OSS stores them"""


_GRAPH_WEIGHTS: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()


def _graph_weights(module: Any, layout: ExpertsLayout) -> tuple:
    """``(gate_up [E, 2I, H], gate_up_bias [E, 2I] | None, down [E, H, I], down_bias [E, H] | None)``, both
    products output-major (each output one contiguous row of its input), gate outputs in ``[0, I)`` and up outputs
    in ``[I, 2I)``: the module's own weights where they are stored so (Qwen3-MoE, DeepSeek-V3), else a copy kept
    beside them (GPT-OSS stores its experts input-major and interleaved; with
    the halves de-interleaved the bf16 pass ran ~20 % faster than reading them interleaved in place); kept per
    module and read again when a weight changes (storage or version counter)."""
    stamp = _stamp(module)
    cached = _GRAPH_WEIGHTS.get(module)
    if cached is not None and cached[0] == stamp:  # read once per weight change, not per pass and layer
        return cached[1]
    gu, dn = module.gate_up_proj.detach(), module.down_proj.detach()
    b_gu = module.gate_up_proj_bias.detach() if layout.has_bias else None
    b_d = module.down_proj_bias.detach() if layout.has_bias else None
    if layout.transposed:  # [E, in, out] -> [E, out, in]
        gu, dn = gu.transpose(1, 2), dn.transpose(1, 2)
    if not (gu.is_contiguous() and dn.is_contiguous()) or layout.interleaved:
        if layout.interleaved:  # gate outputs first, then up: each half one contiguous block
            gu = torch.cat([gu[:, 0::2], gu[:, 1::2]], dim=1)
            b_gu = torch.cat([b_gu[:, 0::2], b_gu[:, 1::2]], dim=1) if b_gu is not None else None
        gu, dn = gu.contiguous(), dn.contiguous()
    out = (gu, b_gu, dn, b_d)
    _GRAPH_WEIGHTS[module] = (stamp, out)
    return out


_KERNEL_WEIGHTS: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()


def _kernel_weights(module: Any, layout: ExpertsLayout) -> tuple:
    """``(gate_up [E, H, 2I], gate_up_bias [E, 2I] | None, down [E, I, H], down_bias [E, H] | None)`` input-major
    and contiguous, gate / up columns as the module orders them, for :func:`row_kernels.row_experts`: the
    module's own tensors where they are stored so (GPT-OSS in float32), else a copy kept beside them (read again
    when a weight changes, as :func:`_graph_weights`)."""
    stamp = _stamp(module)
    cached = _KERNEL_WEIGHTS.get(module)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    gu, dn = module.gate_up_proj.detach(), module.down_proj.detach()
    if not layout.transposed:  # [E, out, in] -> [E, in, out]
        gu, dn = gu.transpose(1, 2), dn.transpose(1, 2)
    biases = [module.gate_up_proj_bias.detach().contiguous(), module.down_proj_bias.detach().contiguous()] \
        if layout.has_bias else [None, None]
    out = (gu.contiguous(), biases[0], dn.contiguous(), biases[1])
    _KERNEL_WEIGHTS[module] = (stamp, out)
    return out


def _graph_forward(cfg: _GraphLayout, weights: tuple, hidden: torch.Tensor, top_k_index: torch.Tensor,
                   top_k_weights: torch.Tensor) -> torch.Tensor:
    """:func:`union_experts_forward` as a pure function of tensors (the graph form, see :func:`graph_experts`):
    ``hidden [T, H]``, ``top_k_index [T, K]``, ``top_k_weights [T, K]`` -> ``[T, H]`` in ``hidden``'s dtype.

    The ``T * K`` (token, expert) slots in ascending expert id (stable), so an expert's slots are computed one
    after the other: its weights are read from memory once per pass and from cache for its further slots (the
    union). Each slot's products are explicit reductions over the rows of its expert's weights, read in place
    (compiled: one loop per output element, the same whatever ``T``), each projection rounded to the weights'
    dtype as the model's own loop rounds it; the routing weights applied in float32, each token's experts added
    in ascending expert id."""
    gu, b_gu, dn, b_d = weights
    t, k = top_k_index.shape
    dtype = gu.dtype
    flat = top_k_index.reshape(-1)
    order = flat.argsort(stable=True)
    e = flat[order]
    x = hidden.to(dtype).float()[order // k]  # [T * K, H]: each slot's token (a gather: no layout decision)
    if cfg.kernel:
        y = torch.ops.specmoe.row_experts(x, e, gu, b_gu, dn, b_d, cfg.intermediate, cfg.interleaved,
                                           cfg.swiglu_oai, cfg.alpha, cfg.limit)
        return _graph_combine(y, top_k_index, top_k_weights, order, hidden.dtype)
    h = (x[:, None, :] * gu[e].float()).sum(-1)
    if b_gu is not None:
        h = h + b_gu[e].float()
    gate, up = h.to(dtype).float().split(cfg.intermediate, dim=-1)
    if cfg.swiglu_oai:
        gate = gate.clamp(max=cfg.limit)
        up = up.clamp(min=-cfg.limit, max=cfg.limit)
        a = (up + 1) * (gate * torch.sigmoid(gate * cfg.alpha))
    else:
        a = torch.nn.functional.silu(gate) * up
    a = a.to(dtype).float()
    y = (a[:, None, :] * dn[e].float()).sum(-1)
    if b_d is not None:
        y = y + b_d[e].float()
    return _graph_combine(y.to(dtype).float(), top_k_index, top_k_weights, order, hidden.dtype)


def _graph_combine(y: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, order: torch.Tensor,
             dtype: torch.dtype) -> torch.Tensor:
    """The slots' expert outputs ``y [T * K, H]`` (float32, slots in ``order``) scaled by their routing weights
    in float32 and added per token in ascending expert id -> ``[T, H]`` in ``dtype``."""
    t, k = top_k_index.shape
    y = y * top_k_weights.reshape(-1)[order].float()[:, None]
    # back to (token, slot), each token's slots in ascending expert id
    where = torch.empty_like(order).scatter_(0, order, torch.arange(t * k, device=order.device))
    y = y[where.view(t, k).gather(1, top_k_index.argsort(dim=1, stable=True))]  # [T, K, H]
    acc = y[:, 0]
    for j in range(1, k):
        acc = acc + y[:, j]
    return acc.to(dtype)


def graph_experts(module: Any) -> GraphExperts | None:
    """The graph form of :func:`union_experts_forward` for ``module``: a CPU experts module of the GPT-OSS
    (``swiglu_oai``) or a SiLU layout with frozen weights; ``None`` otherwise (a compiled pass calls the module
    as it is). Its products read each union expert's weights in place, as the eager path's packed or single-row
    kernels do, in generated loops instead of ~25 framework operations per layer."""
    layout = _layout(module)
    w = module.gate_up_proj
    if (w.device.type != "cpu" or w.requires_grad or module.down_proj.requires_grad
            or layout.activation not in (ACT_SWIGLU_OAI, ACT_SILU)):
        return None
    kernel = w.dtype in row_kernels.DTYPES and row_kernels.available()
    cfg = _GraphLayout(intermediate=layout.intermediate, swiglu_oai=layout.activation == ACT_SWIGLU_OAI,
                       alpha=layout.alpha, limit=layout.limit, kernel=kernel, interleaved=layout.interleaved)
    return GraphExperts(forward=functools.partial(_graph_forward, cfg),
                        weights=functools.partial(_kernel_weights if kernel else _graph_weights, module, layout))
