# SPDX-License-Identifier: Apache-2.0
"""Row-invariant products on CPUs for the compiled decoding pass (``row_kernels.cpp``).

The compiled decoding pass (``specmoe_plugins.targets.hf.graph``) must give a row the same result whatever the number of
rows beside it: a verification pass must round as the autoregressive step does, or speculation is not lossless.
These kernels take **input-major** weights (``w [K, N]``) and compute each output as a plain running sum over the
inputs in order, in vector lanes over the outputs, so an output's operations are the same whichever block, vector
width or row count computes it; each weight row is loaded (in bf16: converted) once for a block of up to four rows.
A row whose input equals the previous row's bit for bit takes that row's result instead of computing it again.

* :func:`row_experts` (``specmoe::row_experts``): each (token, expert) slot's expert MLP, slots sorted by expert;
* :func:`row_linear` (``specmoe::row_linear``): a dense product (the attention's projections, the LM head).

Built through inductor's :class:`torch._inductor.codecache.CppCodeCache` (inductor's compiler and flags,
``-ffp-contract=off`` among them, so every multiply and add rounds on its own) at the first :func:`available` call
in a process. Where it cannot be built, or with ``SPECMOE_ROW_KERNELS=0``, :func:`available` is false and the
compiled pass keeps its generated loops.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path

import torch

__all__ = ["available", "row_experts", "row_linear", "DTYPES"]

logger = logging.getLogger(__name__)

#: weight dtypes the kernels read
DTYPES = (torch.float32, torch.bfloat16)

_SOURCE = Path(__file__).with_name("row_kernels.cpp")
#: the loaded functions, empty where not built
_FN: dict = {}
_TRIED: list = []


def _load() -> dict:
    from torch._inductor.codecache import CppCodeCache

    lib = CppCodeCache.load(_SOURCE.read_text())
    p, i64, f32, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
    experts = lib.specmoe_slot_experts
    experts.argtypes = [p, p, i64, p, p, p, p, i64, i64, c_int, c_int, c_int, f32, f32, p, p, p, p]
    experts.restype = None
    linear = lib.specmoe_linear
    linear.argtypes = [p, i64, p, p, i64, i64, c_int, p, p]
    linear.restype = None
    return {"experts": experts, "linear": linear}


def available() -> bool:
    """Whether the kernels are built and loaded in this process (built at the first call)."""
    if os.environ.get("SPECMOE_ROW_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not _TRIED:
        _TRIED.append(True)
        try:
            _FN.update(_load())
        except Exception as exc:  # no compiler, a failed build: the generated loops run instead
            logger.warning("specmoe: the row-invariant CPU kernels could not be built (%s: %s); the compiled "
                           "decoding pass keeps its generated loops", type(exc).__name__, exc)
    return bool(_FN)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _bf16(w: torch.Tensor) -> int:
    return int(w.dtype == torch.bfloat16)


_SCRATCH = threading.local()


def _scratch(name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A buffer of at least ``numel`` elements kept per thread (the kernels' scratch never leaves a call)."""
    buf = getattr(_SCRATCH, name, None)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(max(numel, 1), dtype=dtype)
        setattr(_SCRATCH, name, buf)
    return buf


def row_experts(x: torch.Tensor, experts: torch.Tensor, gate_up: torch.Tensor, gate_up_bias: torch.Tensor | None,
                down: torch.Tensor, down_bias: torch.Tensor | None, intermediate: int, interleaved: bool,
                swiglu_oai: bool, alpha: float, limit: float) -> torch.Tensor:
    """Each slot's expert MLP (only after :func:`available`): ``x [S, H]`` float32 (in the weights' precision),
    ``experts [S]`` int64 ascending, input-major weights ``gate_up [E, H, 2I]`` (``interleaved``: gate and up
    outputs alternate, else gate first), ``gate_up_bias [E, 2I]``, ``down [E, I, H]``, ``down_bias [E, H]``
    (biases optional; float32 or bfloat16, contiguous) -> float32 ``[S, H]``, each projection rounded to the
    weights' dtype as the model's own loop rounds it. ``swiglu_oai``: GPT-OSS's clamped gate (``alpha``,
    ``limit``); else SiLU(gate) * up."""
    s, h = x.shape
    x, experts = x.contiguous(), experts.contiguous()
    y = torch.empty(s, h, dtype=torch.float32)
    hbuf = _scratch("h", s * 2 * intermediate, torch.float32)
    abuf = _scratch("a", s * intermediate, torch.float32)
    slots = _scratch("slots", s, torch.int64)
    _FN["experts"](x.data_ptr(), experts.data_ptr(), s, gate_up.data_ptr(), _ptr(gate_up_bias), down.data_ptr(),
                   _ptr(down_bias), h, intermediate, _bf16(gate_up), int(interleaved), int(swiglu_oai), alpha,
                   limit, y.data_ptr(), hbuf.data_ptr(), abuf.data_ptr(), slots.data_ptr())
    return y


def row_linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x [M, K]`` float32 (in the weights' precision) times the input-major ``weight_t [K, N]`` (+ ``bias
    [N]``; float32 or bfloat16, contiguous) -> float32 ``[M, N]``, unrounded. Only after :func:`available`."""
    m, k = x.shape
    n = weight_t.shape[1]
    x = x.contiguous()
    y = torch.empty(m, n, dtype=torch.float32)
    _FN["linear"](x.data_ptr(), m, weight_t.data_ptr(), _ptr(bias), k, n, _bf16(weight_t), y.data_ptr(),
                  _scratch("slots", m, torch.int64).data_ptr())
    return y


# Plain operators (a CPU and a Meta kernel), not ``torch.library.custom_op``: its autograd and schema wrappers cost
# more per call inside a compiled pass
_LIBRARY = torch.library.Library("specmoe", "FRAGMENT")
_LIBRARY.define("row_experts(Tensor x, Tensor experts, Tensor gate_up, Tensor? gate_up_bias, Tensor down, "
                "Tensor? down_bias, int intermediate, bool interleaved, bool swiglu_oai, float alpha, "
                "float limit) -> Tensor")
_LIBRARY.define("row_linear(Tensor x, Tensor weight_t, Tensor? bias) -> Tensor")
_LIBRARY.impl("row_experts", row_experts, "CPU")
_LIBRARY.impl("row_linear", row_linear, "CPU")
_LIBRARY.impl("row_experts", lambda x, *args: x.new_empty(x.shape, dtype=torch.float32), "Meta")
_LIBRARY.impl("row_linear", lambda x, weight_t, bias: x.new_empty((x.shape[0], weight_t.shape[1]),
                                                                  dtype=torch.float32), "Meta")
