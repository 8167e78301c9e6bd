# SPDX-License-Identifier: Apache-2.0
"""Compiled inference functions on CPUs: the settings and helpers the compiled passes share (the target's
decoding pass, ``specmoe_plugins.targets.hf.graph``; a drafter's step).

A compiled function here is ``torch.compile(fullgraph=True)`` of a pure function of tensors, with:

* its own code object (:func:`compile_fn`): ``torch.compile`` keeps compiled variants, and their limit, per
  code object, so each owner (a target, a draft model) compiles and guards its own;
* the sizes that vary marked dynamic (:func:`dynamic`), every other size a constant of the variant;
* inputs with the strides of new tensors (:func:`standard`), so a view's layout never starts a new variant;
* the inductor settings of :data:`INDUCTOR`;
* its weights read once per change of any model's structure (:func:`structure_generation`), not on every call;
* products written as explicit reductions (:func:`project`) where their result must not depend on the row count.

``SPECMOE_COMPILE=0`` switches every compiled function off (:func:`enabled`); where compiling fails (no C++
compiler on the machine, an operation inductor does not support) the owner runs its eager code instead, said
once in the log.
"""

from __future__ import annotations

import os
import types
from typing import Callable

import torch

__all__ = ["enabled", "compile_fn", "standard", "dynamic", "INDUCTOR", "failure", "structure_generation", "project"]

#: inductor settings: no per-call size / alignment checks of the inputs and buffers (their layout is ours:
#: :func:`standard`), which cost a third of a one-token pass of the demo target, and no bounds check of gathers
#: in the innermost loops (the indices come from ``topk``, sorts and positions, in range by construction): with
#: the check the experts' gathered products ran at a third of the memory bandwidth
INDUCTOR = {"size_asserts": False, "alignment_asserts": False, "assert_indirect_indexing": False}


def enabled() -> bool:
    """Whether compiled functions are allowed (``SPECMOE_COMPILE`` unset, or not ``0`` / ``false``)."""
    return os.environ.get("SPECMOE_COMPILE", "1").strip().lower() not in ("0", "false", "no", "off")


def compile_fn(fn: Callable) -> Callable:
    """``fn`` compiled (lazily, at its first call) as a whole graph, from a copy with its own code object."""
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
    its modules stays valid while the count is unchanged (an in-place update keeps the tensor, and ``.data``
    assignments keep the parameter object the list holds). Why: reading the ~60 weights of the demo target's
    pass through ``nn.Module.__getattr__``, and the experts' graph weights, took ~0.25 ms of a 3.3 ms one-token
    pass (bf16, 2-core Zen 4)."""
    if not _WATCHING:
        from torch.nn.modules import module as nn_module

        _WATCHING.extend([nn_module.register_module_parameter_registration_hook(_changed),
                          nn_module.register_module_buffer_registration_hook(_changed),
                          nn_module.register_module_module_registration_hook(_changed)])
        _GENERATION[0] += 1
    return _GENERATION[0]


def standard(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a new contiguous tensor of its shape, not a view: a view such as ``x[:, j:j + 1]`` is contiguous
    but keeps other strides on its size-one dimensions, and a view's base is guarded on too (a compiled function
    first called with ``m[None]`` recompiled at the first call with a tensor of its own: 0.3-1 s in a timed
    step)."""
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
    """``F.linear`` in float32 as an explicit reduction onto a shaped output: ``x [..., in]``, ``weight [*out, in]``
    (e.g. the heads of a projection, ``[heads, D, in]``) -> float32 ``[..., *out]``, without reshaping the result.
    Compiled, each output element is one loop over ``in`` whatever the number of rows."""
    xf = x.float()[(..., *([None] * (weight.dim() - 1)), slice(None))]
    y = (xf * weight.float()).sum(-1)
    return y if bias is None else y + bias.float()
