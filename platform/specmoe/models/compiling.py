# SPDX-License-Identifier: Apache-2.0
"""Compiled inference functions on CPUs: the settings and helpers the compiled passes share (the target's
decoding pass, a drafter's step).

A compiled function is ``torch.compile(fullgraph=True)`` of a pure function of tensors with its own code object
(:func:`compile_fn`), varying sizes marked :func:`dynamic`, inputs with the strides of new tensors
(:func:`standard`), and products written as explicit reductions (:func:`project`) where their result must not
depend on the row count. ``SPECMOE_COMPILE=0`` switches every compiled function off (:func:`enabled`); where
compiling fails the owner runs its eager code instead, said once in the log.
"""

from __future__ import annotations

import os
import types
from typing import Callable

import torch

__all__ = ["enabled", "compile_fn", "standard", "dynamic", "INDUCTOR", "failure", "structure_generation", "project"]

#: inductor settings: no per-call size / alignment checks of the inputs (their layout is ours: :func:`standard`)
#: and no bounds check of gathers (the indices come from ``topk``, sorts and positions, in range by construction)
INDUCTOR = {"size_asserts": False, "alignment_asserts": False, "assert_indirect_indexing": False}


def enabled() -> bool:
    """Whether compiled functions are allowed (``SPECMOE_COMPILE`` unset, or not ``0`` / ``false``)."""
    return os.environ.get("SPECMOE_COMPILE", "1").strip().lower() not in ("0", "false", "no", "off")


def compile_fn(fn: Callable) -> Callable:
    """``fn`` compiled (lazily, at its first call) as a whole graph, from a copy with its own code object
    (``torch.compile`` keeps variants, and their limit, per code object)."""
    own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__,
                             fn.__closure__)
    return torch.compile(own, fullgraph=True, options=INDUCTOR)


_GENERATION = [0]
_WATCHING: list = []


def _changed(*_args) -> None:
    _GENERATION[0] += 1


def structure_generation() -> int:
    """A count of the parameters, buffers and submodules assigned to any module since the first call (global
    registration hooks of ``torch.nn``, installed at that call): a list of a model's weight tensors read from
    its modules stays valid while the count is unchanged (in-place updates and ``.data`` assignments keep the
    objects the list holds)."""
    if not _WATCHING:
        from torch.nn.modules import module as nn_module

        _WATCHING.extend([nn_module.register_module_parameter_registration_hook(_changed),
                          nn_module.register_module_buffer_registration_hook(_changed),
                          nn_module.register_module_module_registration_hook(_changed)])
        _GENERATION[0] += 1
    return _GENERATION[0]


def standard(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a new contiguous tensor of its shape, not a view (a view keeps other strides on its size-one
    dimensions, and its base is guarded on too), so a view's layout never starts a new compiled variant."""
    expected, step = [], 1
    for size in reversed(t.shape):
        expected.append(step)
        step *= size
    if tuple(reversed(expected)) == tuple(t.stride()) and t._base is None:
        return t
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def dynamic(t: torch.Tensor, *dims: int) -> torch.Tensor:
    """Mark ``t``'s ``dims`` as sizes that vary between calls (returns ``t``)."""
    if getattr(t, "_dynamo_dynamic_indices", None) != set(dims):
        torch._dynamo.mark_dynamic(t, list(dims))
    return t


def failure(exc: BaseException) -> str:
    """One line saying why compiling failed."""
    text = str(exc).strip().splitlines()
    return f"compiling failed ({type(exc).__name__}: {text[0] if text else ''})"


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` in float32 as an explicit reduction: ``x [..., in]``, ``weight [*out, in]`` (e.g. ``[heads, D,
    in]``) -> float32 ``[..., *out]``. Compiled, each output element is one loop over ``in`` whatever the row count."""
    xf = x.float()[(..., *([None] * (weight.dim() - 1)), slice(None))]
    y = (xf * weight.float()).sum(-1)
    return y if bias is None else y + bias.float()
