# SPDX-License-Identifier: Apache-2.0
"""Linear layers over a few rows on CPUs: the faster BLAS orientation.

Decoding multiplies a handful of rows (the verified tokens, a drafter's frontier) by each weight matrix, so a
linear layer is a weight read. ``F.linear(x, W)`` (``x @ W.T``) on the CPU BLAS of the demo machine (MKL)
streams ``W`` at ~10 GB/s for 2-8 rows, while ``(W @ x.T).T`` streams it at 16-23 GB/s (one core, float32,
measured over weights larger than the caches; the same for 1 row and slower from 16 rows on). Both compute
the same sums; the rounding of the two kernels may differ in the last bits, and every pass of a model (the
speculative verification, the autoregressive reference, ``generate``) goes through the same installed layer.

:func:`install` switches the ``nn.Linear`` layers of a module to :func:`linear`, which takes that route only
for float32 CPU inputs of 2-8 rows without autograd, and ``F.linear`` otherwise (GPUs, large passes, training).
"""

from __future__ import annotations

import types

import torch

__all__ = ["linear", "install", "ROWS"]

#: row counts that take the ``(W @ x.T).T`` route (measured faster on the CPU BLAS; see the module docstring)
ROWS = (2, 8)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: ``x [..., in]``, ``weight [out, in]`` -> ``[..., out]``."""
    rows = x.numel() // max(x.shape[-1], 1) if x.dim() else 0
    grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if (x.device.type != "cpu" or weight.dtype != torch.float32 or x.dtype != torch.float32
            or not ROWS[0] <= rows <= ROWS[1] or grad):
        return torch.nn.functional.linear(x, weight, bias)
    x2 = x.reshape(rows, x.shape[-1]).t()
    out = torch.mm(weight, x2) if bias is None else torch.addmm(bias[:, None], weight, x2)
    return out.t().reshape(*x.shape[:-1], weight.shape[0])


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, self.weight, self.bias)


def install(module: torch.nn.Module) -> int:
    """Route every ``nn.Linear`` of ``module`` through :func:`linear`; returns how many. Layers whose forward a
    device map's hooks wrap are left alone."""
    n = 0
    for sub in module.modules():
        if type(sub) is torch.nn.Linear and not hasattr(sub, "_hf_hook"):
            sub.forward = types.MethodType(_forward, sub)
            n += 1
    return n
