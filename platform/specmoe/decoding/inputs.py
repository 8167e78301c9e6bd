# SPDX-License-Identifier: Apache-2.0
"""Argument checks of the public decoding entry points (:meth:`SpeculativeEngine.generate
<specmoe.decoding.engine.SpeculativeEngine.generate>` and :func:`~specmoe.decoding.ar.ar_generate`).

Bad input ends in one :class:`InputError` naming the argument, row / position and allowed range. Checks run once
per call on the host, never per step.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import TYPE_CHECKING, Any, Sequence

import torch

from specmoe.decoding.stopping import StopRule
from specmoe.errors import UserError

if TYPE_CHECKING:
    from specmoe.interfaces.target import Target

__all__ = ["InputError", "check_generate", "check_ar", "check_prompts", "check_count"]


class InputError(UserError, ValueError):
    """A bad argument of a public decoding call (a :class:`ValueError` and a CLI
    :class:`~specmoe.errors.UserError`)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_count(name: str, value: Any, meaning: str, upper: int | None = None, upper_why: str = "") -> None:
    """``value`` must be an integer in ``[1, upper]`` (``upper=None``: no upper bound)."""
    allowed = "an integer >= 1" if upper is None else f"an integer in [1, {upper}]{upper_why}"
    if not _is_int(value):
        raise InputError(f"{name} ({meaning}) must be {allowed}; got {value!r} ({type(value).__name__})")
    if value < 1 or (upper is not None and value > upper):
        raise InputError(f"{name} ({meaning}) must be {allowed}; got {value}")


def _bad_id(rows: list, b: int, vocab_size: int, arg: str) -> InputError:
    """The message for row ``b``, which holds a non-integer id or one outside ``[0, vocab_size)``."""
    for i, tok in enumerate(rows[b]):
        try:
            t = operator.index(tok)
        except TypeError:
            return InputError(f"{arg}: row {b}, position {i} holds {tok!r} ({type(tok).__name__}), not an integer "
                              f"token id; token ids are integers in [0, {vocab_size})")
        if not 0 <= t < vocab_size:
            outside = [(r, j) for r, row in enumerate(rows) for j, x in enumerate(row)
                       if _is_index(x) and not 0 <= operator.index(x) < vocab_size]
            more = f" ({len(outside)} ids outside it in all)" if len(outside) > 1 else ""
            return InputError(f"{arg}: row {b}, position {i} holds token id {t}, outside the target's vocabulary: "
                              f"ids must be in [0, {vocab_size}) (vocab_size={vocab_size}){more}")
    raise AssertionError("row has no bad id")  # pragma: no cover - only called for a bad row


def _is_index(x: Any) -> bool:
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


def check_prompts(prompts: Any, vocab_size: int, arg: str = "prompts") -> None:
    """``prompts`` must be a non-empty sequence of rows, each a non-empty sequence of integer token ids in
    ``[0, vocab_size)`` (a list of lists, a list of 1-D integer tensors, or a 2-D integer tensor)."""
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() != 2 or prompts.is_floating_point() or prompts.is_complex():
            raise InputError(f"{arg} as a tensor must be 2-D [rows, tokens] of integer token ids; got "
                             f"{tuple(prompts.shape)} {prompts.dtype}")
        prompts = prompts.tolist()
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        raise InputError(f"{arg} must be a list of rows, one list of token ids per row; got "
                         f"{type(prompts).__name__} (text must be tokenized first: target.tokenizer.encode(text))")
    if len(prompts) == 0:
        raise InputError(f"{arg} is empty: give at least one row (one list of token ids per row)")
    rows = []
    for b, row in enumerate(prompts):
        if isinstance(row, torch.Tensor):
            if row.dim() != 1 or row.is_floating_point() or row.is_complex():
                raise InputError(f"{arg}: row {b} is a {tuple(row.shape)} {row.dtype} tensor; a row is a 1-D "
                                 f"sequence of integer token ids")
            row = row.tolist()
        elif isinstance(row, (str, bytes)):
            raise InputError(f"{arg}: row {b} is text ({type(row).__name__}); pass token ids "
                             f"(target.tokenizer.encode(text))")
        elif not isinstance(row, Sequence):
            raise InputError(f"{arg}: row {b} is {type(row).__name__} {row!r}, not a sequence of token ids; "
                             f"{arg} is a list of rows (wrap a single prompt as [ids])")
        if len(row) == 0:
            raise InputError(f"{arg}: row {b} is empty: every prompt needs at least 1 token id in "
                             f"[0, {vocab_size})")
        rows.append(row)
    for b, row in enumerate(rows):
        if set(map(type, row)) <= {int}:
            if min(row) >= 0 and max(row) < vocab_size:
                continue
        elif all(_is_index(x) and 0 <= operator.index(x) < vocab_size for x in row):
            continue
        raise _bad_id(rows, b, vocab_size, arg)


def _check_sampling(temperature: Any, stop: Any, seed: Any) -> None:
    if not isinstance(temperature, numbers.Real) or isinstance(temperature, bool) \
            or not math.isfinite(temperature) or temperature < 0:
        raise InputError(f"temperature must be a finite number >= 0 (0 = greedy); got {temperature!r}")
    if not isinstance(stop, StopRule):
        raise InputError(f"stop must be a StopRule (e.g. StopRule(max_new_tokens=128)); got "
                         f"{type(stop).__name__}")
    check_count("stop.max_new_tokens", stop.max_new_tokens, "tokens generated per row at most")
    if not _is_int(seed):
        raise InputError(f"seed must be an integer; got {seed!r} ({type(seed).__name__})")


def check_ar(target: Target, prompts: Any, *, temperature: Any, stop: Any, seed: Any) -> None:
    """The arguments of :func:`~specmoe.decoding.ar.ar_generate` (raises :class:`InputError`)."""
    check_prompts(prompts, target.vocab_size)
    _check_sampling(temperature, stop, seed)


def check_generate(engine: Any, prompts: Any, *, budget: Any, steps: Any, top_k: Any, temperature: Any,
                   stop: Any, seed: Any, buffer: Any) -> None:
    """The arguments of :meth:`SpeculativeEngine.generate` (raises :class:`InputError`)."""
    target = engine.target
    check_prompts(prompts, target.vocab_size)
    check_count("budget", budget, "γ: tree nodes verified per row and step, root included")
    check_count("steps", steps, "draft tree depth")
    check_count("top_k", top_k, "children per expanded draft node", target.vocab_size,
                " (the target's vocab_size)")
    _check_sampling(temperature, stop, seed)
    if buffer is not None:
        want = (target.num_moe_layers, target.num_experts)
        if not isinstance(buffer, torch.Tensor) or buffer.dtype != torch.bool or tuple(buffer.shape) != want:
            got = (f"{tuple(buffer.shape)} {buffer.dtype}" if isinstance(buffer, torch.Tensor)
                   else type(buffer).__name__)
            raise InputError(f"buffer (the initial expert buffer B0) must be a bool tensor [MoE layers, experts] = "
                             f"{list(want)} for this target, or None; got {got}")
