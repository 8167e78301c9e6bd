# SPDX-License-Identifier: Apache-2.0
"""Linear layers over a few rows on CPUs: the faster BLAS orientation, and the bf16 kernel without per-call
overhead.

Decoding multiplies a handful of rows by each weight matrix, so a linear layer is a weight read. Every pass of a
model (verification, the autoregressive reference, ``generate``) goes through the same installed layer. Routes
(CPU inputs without autograd only; ``F.linear`` otherwise: GPUs, large passes, training):

* float32, 2-8 rows: ``(W @ x.T).T``, which streams ``W`` faster than ``x @ W.T`` on the CPU BLAS; same sums,
  the rounding may differ in the last bits;
* bf16 / fp16, one row: torch's own matrix-vector kernel with fp32 accumulation, oneDNN off for the call
  (:func:`single_row_reduced`; it has no fast kernel from two rows on);
* ``nn.Linear`` layers (:func:`install`): bf16, and float32 above :data:`FP32_PACK_MIN` weights, take oneDNN's
  kernel over the weight packed once into its layout (``torch.ops.mkldnn._reorder_linear_weight``; re-packed
  whenever the weight's storage or version counter changes). With the batch-size hint :data:`PACK_ROWS` each
  row's result is the same for any row count (:func:`packed_row_invariant` checks that before a weight is
  packed). The packed copy doubles the memory of the dense layers.
"""

from __future__ import annotations

import contextlib
import functools
import types

import torch

__all__ = ["shared_pass", "in_shared_pass", "linear", "install", "ROWS",
           "single_row_reduced", "single_row_mm", "reduced_cpu", "FusedLinear",
           "FP32_COPY_MAX", "FP32_PACK_MIN", "PACK_ROWS", "packed_linear", "packed_row_invariant", "onednn_bf16"]

_SHARED = [0]


@contextlib.contextmanager
def shared_pass():
    """A pass that every method runs alike (a prompt pass into an empty cache), whose rows need not round as they
    would alone: inside it, kernels that otherwise take one row per call may take a row block at once."""
    _SHARED[0] += 1
    try:
        yield
    finally:
        _SHARED[0] -= 1


def in_shared_pass() -> bool:
    """Whether a :func:`shared_pass` is running."""
    return _SHARED[0] > 0


#: row counts that take the ``(W @ x.T).T`` route
ROWS = (2, 8)


#: reduced-precision dtypes whose single-row products take torch's own BLAS on CPUs
_REDUCED = (torch.bfloat16, torch.float16)


def single_row_reduced(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` of one bf16 / fp16 CPU row, oneDNN off for the call; same as ``F.linear`` up to rounding."""
    if not torch.backends.mkldnn.enabled:
        return torch.nn.functional.linear(x, weight, bias)
    torch.backends.mkldnn.enabled = False
    try:
        return torch.nn.functional.linear(x, weight, bias)
    finally:
        torch.backends.mkldnn.enabled = True


def single_row_mm(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.mm(x [1, in], weight [in, out], out=out)`` for bf16 / fp16 CPU tensors with ``weight`` stored
    output-major (``weight.t()`` contiguous), oneDNN off for the call (as :func:`single_row_reduced`)."""
    if not torch.backends.mkldnn.enabled:
        return torch.mm(x, weight) if out is None else torch.mm(x, weight, out=out)
    torch.backends.mkldnn.enabled = False
    try:
        return torch.mm(x, weight, out=out)
    finally:
        torch.backends.mkldnn.enabled = True


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: ``x [..., in]``, ``weight [out, in]`` -> ``[..., out]``."""
    rows = x.numel() // max(x.shape[-1], 1) if x.dim() else 0
    grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if x.device.type != "cpu" or grad or x.dtype != weight.dtype:
        return torch.nn.functional.linear(x, weight, bias)
    if x.dtype in _REDUCED:
        if rows == 1 and weight.stride(-1) == 1:
            return single_row_reduced(x, weight, bias)
        return torch.nn.functional.linear(x, weight, bias)
    if x.dtype != torch.float32 or not ROWS[0] <= rows <= ROWS[1]:
        return torch.nn.functional.linear(x, weight, bias)
    x2 = x.reshape(rows, x.shape[-1]).t()
    out = torch.mm(weight, x2) if bias is None else torch.addmm(bias[:, None], weight, x2)
    return out.t().reshape(*x.shape[:-1], weight.shape[0])


@functools.lru_cache(maxsize=1)
def onednn_bf16() -> bool:
    """Whether oneDNN runs bf16 matmuls on this CPU (AVX-512 or AMX): only then are weights packed for it."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (RuntimeError, AttributeError):
        return False


#: the row count oneDNN lays packed weights out for (from 4 on, every row count takes the same kernel)
PACK_ROWS = 4

#: float32 layers of more than this many weights take oneDNN's packed kernel on CPUs
FP32_PACK_MIN = 1 << 16


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` over ``W`` packed by ``torch.ops.mkldnn._reorder_linear_weight``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@functools.lru_cache(maxsize=None)
def packed_row_invariant(dtype: torch.dtype, n_out: int, n_in: int) -> bool:
    """Whether oneDNN's packed linear runs on this CPU for ``dtype`` (float32, or bf16 where oneDNN has bf16
    kernels) and an ``[n_out, n_in]`` weight, agrees with ``F.linear`` to rounding and gives every row the
    result it gives that row alone, for 1 to 16 rows (a one-off trial on random values)."""
    if dtype not in (torch.float32, torch.bfloat16) or (dtype == torch.bfloat16 and not onednn_bf16()):
        return False
    try:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(n_out, n_in, generator=g).to(dtype)
        b = torch.randn(n_out, generator=g).to(dtype)
        x = torch.randn(16, n_in, generator=g).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)
        alone = torch.cat([packed_linear(x[i:i + 1], packed, b) for i in range(16)])
        ref = torch.nn.functional.linear(x.double(), w.double(), b.double())
        if float((alone.double() - ref).abs().max()) > 1e-2 * float(ref.abs().max()):
            return False
        return all(torch.equal(packed_linear(x[:m], packed, b), alone[:m]) for m in range(2, 17))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def _packable(w: torch.Tensor) -> bool:
    if w.dtype == torch.bfloat16:
        return onednn_bf16()
    return w.dtype == torch.float32 and w.numel() > FP32_PACK_MIN and packed_row_invariant(torch.float32, *w.shape)


def _packed(layer: torch.nn.Linear) -> torch.Tensor | None:
    """``layer``'s weight in oneDNN's layout (re-packed whenever it changed), or ``None`` where not packed."""
    w = layer.weight
    stamp = (w.data_ptr(), w._version, w.dtype)
    cached = layer.__dict__.get("_specmoe_packed")
    if cached is not None and cached[0] == stamp:
        return cached[1]
    packed = None
    if _packable(w):
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS)
        except (RuntimeError, AttributeError):
            packed = None
    layer.__dict__["_specmoe_packed"] = (stamp, packed)
    return packed


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w = self.weight
    if (x.dtype == w.dtype and x.device.type == "cpu" and torch.backends.mkldnn.enabled
            and (x.dtype == torch.bfloat16 or (x.dtype == torch.float32 and w.numel() > FP32_PACK_MIN))
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
        packed = _packed(self)
        if packed is not None:
            return packed_linear(x, packed, self.bias)
    return linear(x, w, self.bias)


def install(module: torch.nn.Module) -> int:
    """Route every ``nn.Linear`` of ``module`` through :func:`linear`; returns how many. Layers whose forward a
    device map's hooks wrap are left alone."""
    n = 0
    for sub in module.modules():
        if type(sub) is torch.nn.Linear and not hasattr(sub, "_hf_hook"):
            sub.forward = types.MethodType(_forward, sub)
            n += 1
    return n


#: reduced-precision layers of at most this many weights compute in float32 over a copy (see :class:`FusedLinear`)
FP32_COPY_MAX = 1 << 18


def reduced_cpu(weight: torch.Tensor) -> bool:
    """A bf16 / fp16 weight on a CPU."""
    return weight.device.type == "cpu" and weight.dtype in _REDUCED


class FusedLinear:
    """Inference-only projection ``x [..., in] -> [..., out]`` over the weights of one or several
    ``nn.Linear`` layers (concatenated along the output dimension: queries, keys and values in one product),
    rebuilt whenever one of them changes (storage or version counter).

    Float32: an ``nn.Linear`` routed by :func:`install` (a single layer is called as it is, no copy). Reduced
    precision on a CPU, up to :data:`FP32_COPY_MAX` weights: the product in float32 over a float32 copy of the
    weights (exact) and the output cast back (``keep_float``: left in float32, for logits), i.e. float32
    accumulation, faster than the bf16 kernels for a few rows and the same result for a row whatever the number of
    rows. Larger layers keep their dtype and take the packed kernel (:func:`install`).

    ``row_invariant=False`` (a drafter: verification decides what is committed): on a CPU the product is
    ``x @ Wᵀ`` over an input-major float32 copy of the weights (``[in, out]`` contiguous; reduced-precision
    layers up to :data:`FP32_COPY_MAX` weights), faster for a few rows, but its rounding may depend on the row
    count.
    """

    def __init__(self, layers: "list[torch.nn.Linear]", keep_float: bool = False,
                 row_invariant: bool = True) -> None:
        self.layers = list(layers)
        self.keep_float = keep_float
        self.row_invariant = row_invariant
        self.reduced = False
        self._stamp: tuple | None = None
        self._lin: torch.nn.Linear | None = None
        self._in_major: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def _current(self) -> torch.nn.Linear | None:
        """The layer to run (``None``: the single model layer as it is), rebuilt when a weight changed."""
        stamp = tuple((m.weight.data_ptr(), m.weight._version, m.weight.dtype, m.weight.device) for m in self.layers)
        if stamp == self._stamp:
            return self._lin
        size = sum(m.weight.numel() for m in self.layers)
        self.reduced = reduced_cpu(self.layers[0].weight) and size <= FP32_COPY_MAX
        lin = None
        w0 = self.layers[0].weight
        self._in_major = None
        if not self.row_invariant and w0.device.type == "cpu" and (w0.dtype == torch.float32 or self.reduced):
            w = torch.cat([m.weight.detach() for m in self.layers], dim=0).float().t().contiguous()
            b = None
            if self.layers[0].bias is not None:
                b = torch.cat([m.bias.detach() for m in self.layers], dim=0).float()
            self._in_major = (w, b)
            self._lin, self._stamp = None, stamp
            return None
        if self.reduced or len(self.layers) > 1:
            w = torch.cat([m.weight.detach() for m in self.layers], dim=0)
            has_bias = self.layers[0].bias is not None
            b = torch.cat([m.bias.detach() for m in self.layers], dim=0) if has_bias else None
            if self.reduced:
                w, b = w.float(), (b.float() if b is not None else None)
            lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=has_bias, device=w.device, dtype=w.dtype)
            lin.requires_grad_(False)
            lin.weight.data = w
            if b is not None:
                lin.bias.data = b
            install(lin)
        self._lin, self._stamp = lin, stamp
        return lin

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lin = self._current()
        if self._in_major is not None:
            w, b = self._in_major
            y = torch.matmul(x if x.dtype == torch.float32 else x.float(), w)
            if b is not None:
                y = y.add_(b)
            if self.keep_float:
                return y if y.dtype == torch.float32 else y.float()
            return y.to(x.dtype) if self.reduced and y.dtype != x.dtype else y  # (autocast picks a float32 layer's)
        if lin is None:
            y = self.layers[0](x)
        elif self.reduced:
            y = lin(x.float())
            return y if self.keep_float else y.to(x.dtype)
        else:
            y = lin(x)
        return y.float() if self.keep_float else y
