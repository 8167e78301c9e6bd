# SPDX-License-Identifier: Apache-2.0
"""Argument checks of the Target / Drafter methods, installed on every implementation by :func:`checked_method`:
a bad call raises one ``ValueError`` naming method, argument and expected shape before the implementation runs.
They read shapes, dtypes and Python values only, never a device value (token ids: :mod:`specmoe.decoding.inputs`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

__all__ = ["checked_method", "check_count", "check_shape", "check_forward", "check_forward_standard",
           "check_begin", "check_draft"]


def checked_method(cls: type, name: str, check: Callable[..., None]) -> None:
    """Make ``cls.<name>``, if ``cls`` defines it (not abstract, not yet wrapped), run ``check`` first."""
    fn = cls.__dict__.get(name)
    if not callable(fn) or getattr(fn, "__isabstractmethod__", False) or getattr(fn, "_specmoe_checked", False):
        return

    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        check(self, *args, **kwargs)
        return fn(self, *args, **kwargs)

    method._specmoe_checked = True  # type: ignore[attr-defined]
    setattr(cls, name, method)


def check_count(where: str, name: str, value: Any, low: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{where}: {name} must be an integer >= {low}; got {value!r}")


def check_shape(where: str, name: str, value: Any, want: Sequence[int], labels: str, kind: str = "",
                one_row: bool = False) -> None:
    """``value`` must be a tensor of shape ``want`` (``one_row``: or ``[1, ...]``) named ``labels`` (``"[B, N]"``);
    ``kind`` ``"bool"`` / ``"int"`` restricts the dtype."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        raise ValueError(f"{where}: {name} must be a {labels} tensor; got {type(value).__name__}")
    ok = tuple(shape) == tuple(want) or (one_row and len(shape) > 0 and tuple(shape) == (1, *want[1:]))
    is_bool = str(dtype) == "torch.bool"
    is_int = not (is_bool or value.is_floating_point() or value.is_complex())
    if not ok or (kind == "bool" and not is_bool) or (kind == "int" and not is_int):
        want_str = ", ".join(str(w) for w in want)
        rows = f" (or [1, {want_str.partition(', ')[2]}])" if one_row else ""
        raise ValueError(f"{where}: {name} is {tuple(shape)} {dtype}; expected {labels} = [{want_str}]{rows}"
                         f"{' ' + kind if kind else ''}")


def _token_batch(where: str, input_ids: Any) -> tuple[int, int]:
    """``(B, N)`` of a ``[B, N]`` integer token tensor with at least one row and one token."""
    shape = getattr(input_ids, "shape", None)
    if shape is None or len(shape) != 2 or input_ids.is_floating_point() or str(input_ids.dtype) == "torch.bool":
        got = f"{tuple(shape)} {input_ids.dtype}" if shape is not None else type(input_ids).__name__
        raise ValueError(f"{where}: input_ids must be a [B, N] int64 tensor of token ids; got {got}")
    b, n = int(shape[0]), int(shape[1])
    if b < 1 or n < 1:
        raise ValueError(f"{where}: input_ids is {tuple(shape)}: it needs B >= 1 rows and N >= 1 tokens")
    return b, n


def check_forward(target: Any, input_ids: Any, kv: Any, positions: Any, attend: Any = None, valid: Any = None, *,
                  cached_attend: Any = None, logits_at: Any = None, **_: Any) -> None:
    """``Target.forward``: every tensor agrees with ``input_ids [B, N]`` and the KV state's rows."""
    where = f"{type(target).__name__}.forward"
    b, n = _token_batch(where, input_ids)
    rows = getattr(kv, "batch_size", b)
    if rows != b:
        raise ValueError(f"{where}: kv holds {rows} rows but input_ids has B = {b} (a KV state per batch: "
                         f"target.new_kv({b}))")
    check_shape(where, "positions", positions, (b, n), "[B, N]", "int")
    if attend is not None:
        check_shape(where, "attend", attend, (b, n, n), "[B, N, N]", "bool")
    if valid is not None:
        check_shape(where, "valid", valid, (b, n), "[B, N]", "bool")
    if cached_attend is not None:
        check_shape(where, "cached_attend", cached_attend, (b, n, getattr(kv, "num_slots", 0)), "[B, N, S cached]",
                    "bool")
    if logits_at is not None:
        check_shape(where, "logits_at", logits_at, (b, int(getattr(logits_at, "shape", (0,))[-1])), "[B, P]", "int")


def check_forward_standard(target: Any, input_ids: Any, attention_mask: Any, positions: Any, cache: Any = None, *,
                           logits_to_keep: Any = 0, **_: Any) -> None:
    where = f"{type(target).__name__}.forward_standard"
    b, n = _token_batch(where, input_ids)
    check_shape(where, "positions", positions, (b, n), "[B, N]", "int", one_row=True)
    if attention_mask is not None:
        shape = getattr(attention_mask, "shape", None)
        if shape is None or len(shape) != 2 or shape[0] not in (1, b) or shape[1] < n:
            raise ValueError(f"{where}: attention_mask must be [B, S + N] = [{b}, >= {n}] (cached and new tokens); "
                             f"got {tuple(shape) if shape is not None else type(attention_mask).__name__}")
    check_count(where, "logits_to_keep", logits_to_keep, low=0)


def check_begin(drafter: Any, batch_size: Any, *_: Any, **__: Any) -> None:
    check_count(f"{type(drafter).__name__}.begin", "batch_size", batch_size)


def check_draft(drafter: Any, state: Any, committed: Any, steps: Any, top_k: Any, *_: Any, **__: Any) -> None:
    """``Drafter.draft``: ``steps`` / ``top_k`` >= 1, ``Committed`` tensors agree with ``committed.tokens [B, M]``."""
    where = f"{type(drafter).__name__}.draft"
    check_count(where, "steps", steps)
    check_count(where, "top_k", top_k)
    tokens = getattr(committed, "tokens", None)
    if tokens is None or not all(hasattr(committed, a) for a in ("valid", "positions", "features")):
        raise ValueError(f"{where}: committed must be a Committed (tokens, valid, positions, features); got "
                         f"{type(committed).__name__}")
    shape = tuple(getattr(tokens, "shape", ()))
    if len(shape) != 2:
        raise ValueError(f"{where}: committed.tokens must be a [B, M] int64 tensor; got {shape}")
    check_shape(where, "committed.tokens", tokens, shape, "[B, M]", "int")
    check_shape(where, "committed.valid", committed.valid, shape, "[B, M]", "bool")
    check_shape(where, "committed.positions", committed.positions, shape, "[B, M]", "int")
    if committed.features is not None:
        feat = int(getattr(committed.features, "shape", (0,))[-1])
        check_shape(where, "committed.features", committed.features, (*shape, feat), "[B, M, F]")
