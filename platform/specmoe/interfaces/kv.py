# SPDX-License-Identifier: Apache-2.0
"""KV cache state for tree decoding on Hugging Face models (targets and HF draft models).

Each layer writes keys / values in place into ``[B, H, capacity, D]`` buffers (:class:`SlotLayer`), doubled on
overflow. Every layer is full (sliding windows are applied through the mask, so rejected tree tokens never displace
context); slots are tracked per row (``pos`` / ``valid [B, S]``; padding masked out).
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch

__all__ = ["KVState", "SlotLayer", "slot_cache", "additive_mask", "tree_masks"]

#: slots a fresh buffer holds when no capacity was asked for
_MIN_CAPACITY = 64


@functools.lru_cache(maxsize=None)
def _zero(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 0-dim zero of ``dtype`` (read only, shared)."""
    return torch.zeros((), dtype=dtype, device=device)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool ``[...]`` -> float mask with 0 where allowed and ``finfo(dtype).min`` elsewhere."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device) if torch.compiler.is_compiling() \
        else _zero(dtype, allowed.device)  # (a compiled pass makes its own: no cached tensor to trace)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def _grown(buf: torch.Tensor, length: int, need: int) -> torch.Tensor:
    """A buffer like ``buf`` (slots on dim 2) with room for ``need`` slots, holding its first ``length``."""
    cap = max(need, 2 * buf.shape[2])
    out = buf.new_empty(*buf.shape[:2], cap, *buf.shape[3:])
    out.narrow(2, 0, length).copy_(buf.narrow(2, 0, length))
    return out


def tree_masks(pos: torch.Tensor, valid: torch.Tensor, q_pos: torch.Tensor, attend: torch.Tensor,
               q_valid: torch.Tensor, windows: Sequence[int | None], cached_attend: torch.Tensor | None = None,
               dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """:meth:`KVState.masks` as a pure function of the slots' ``pos`` / ``valid [B, S]`` (for compiled passes)."""
    n = q_pos.shape[1]
    keys_pos = torch.cat([pos, q_pos], dim=1)  # [B, S + N]
    q_col = q_valid[:, :, None]
    old = valid[:, None, :] & q_col
    if cached_attend is not None:
        old = old & cached_attend
    if n == 1:  # the expression below for one query: it sees itself where attend does or it is padding
        new = attend | ~q_col
    else:
        eye = torch.eye(n, dtype=torch.bool, device=q_pos.device)[None]
        new = (attend & q_valid[:, None, :] & q_col) | (eye & ~q_col)
    base = torch.cat([old, new], dim=2)
    out = []
    for window in windows:
        allowed = base
        if window is not None:
            allowed = base & ((q_pos[:, :, None] - keys_pos[:, None, :]) < window)
        allowed = allowed[:, None]
        out.append(allowed if dtype is None else additive_mask(allowed, dtype))
    return out


class SlotLayer:
    """One attention layer's keys / values in preallocated buffers, written in place (``transformers`` cache layer)."""

    is_sliding = False
    is_compileable = False
    is_croppable = True

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = capacity
        self.length = 0
        self.keys: torch.Tensor | None = None  # [B, H, length, D] views of the buffers
        self.values: torch.Tensor | None = None
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self.is_initialized = False
        self.device: torch.device | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        cap = max(self.capacity, key_states.shape[-2], _MIN_CAPACITY)
        self.device = key_states.device
        self._k = key_states.new_empty(*key_states.shape[:2], cap, key_states.shape[-1])
        self._v = value_states.new_empty(*value_states.shape[:2], cap, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append ``[B, H, N, D]`` keys / values; returns the filled ``[B, H, S + N, D]`` views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        end = self.length + n
        if end > self._k.shape[2]:
            self._k, self._v = _grown(self._k, self.length, end), _grown(self._v, self.length, end)
        self._k.narrow(2, self.length, n).copy_(key_states)
        self._v.narrow(2, self.length, n).copy_(value_states)
        self._set_length(end)
        return self.keys, self.values

    def reserve(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``[B, H, C, D]`` buffers with room for ``n`` slots after :attr:`length`; write, then :meth:`advance`."""
        end = self.length + n
        if end > self._k.shape[2]:
            self._k, self._v = _grown(self._k, self.length, end), _grown(self._v, self.length, end)
        return self._k, self._v

    def advance(self, n: int) -> None:
        """Count ``n`` slots written after :attr:`length` (see :meth:`reserve`)."""
        self._set_length(self.length + n)

    def _set_length(self, length: int) -> None:
        self.length = length
        if self._k is not None:
            self.keys = self._k.narrow(2, 0, length)
            self.values = self._v.narrow(2, 0, length)

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def truncate(self, length: int) -> None:
        """Forget the slots from ``length`` on (nothing is copied)."""
        self._set_length(min(length, self.length))

    def move(self, start: int, src: torch.Tensor) -> None:
        """Slots ``start + src[j]`` -> ``start + j`` (``src [M]`` ascending, any device); keep ``start + M``."""
        if self._k is None:
            return
        idx = src.to(self._k.device) + start
        m = int(src.shape[0])
        for buf in (self._k, self._v):
            buf.narrow(2, start, m).copy_(buf.index_select(2, idx))
        self._set_length(start + m)

    def compact(self, start: int, order: torch.Tensor, length: int) -> None:
        """Row-wise reorder of the ``n`` slots from ``start`` by ``order [B, n]`` (kept ones first); keep ``length``."""
        if self._k is None:
            return
        n = order.shape[1]
        idx = order.to(self._k.device)
        for buf in (self._k, self._v):
            region = buf.narrow(2, start, n)
            gathered = region.gather(2, idx[:, None, :, None].expand(buf.shape[0], buf.shape[1], n, buf.shape[3]))
            region.copy_(gathered)
        self._set_length(length)

    def reset(self) -> None:
        self._set_length(0)


def slot_cache(capacity: int = 0):
    """A ``DynamicCache`` (models check the type) whose lazy layers are :class:`SlotLayer` s of ``capacity``."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layer_class_to_replicate = functools.partial(SlotLayer, capacity)
    return cache


class KVState:
    """:class:`SlotLayer` cache plus each slot's position / validity; ``capacity`` slots per row, then doubled."""

    def __init__(self, batch_size: int, device: torch.device | str = "cpu", capacity: int = 0) -> None:
        cap = max(int(capacity), _MIN_CAPACITY)
        self.cache = slot_cache(cap)
        self._pos = torch.zeros(batch_size, cap, dtype=torch.long, device=device)
        self._valid = torch.zeros(batch_size, cap, dtype=torch.bool, device=device)
        self._len = 0

    @property
    def pos(self) -> torch.Tensor:
        """``[B, S]`` absolute position of every cached slot."""
        return self._pos.narrow(1, 0, self._len)

    @property
    def valid(self) -> torch.Tensor:
        """``[B, S]`` bool: the slot holds a committed (or current-pass) token of its row."""
        return self._valid.narrow(1, 0, self._len)

    @property
    def batch_size(self) -> int:
        return int(self._pos.shape[0])

    @property
    def num_slots(self) -> int:
        return self._len

    @property
    def capacity(self) -> int:
        return int(self._pos.shape[1])

    def next_position(self) -> torch.Tensor:
        """``[B]`` the position of the next token of each row (number of committed valid tokens)."""
        return self.valid.sum(dim=1)

    def _layers(self) -> list[SlotLayer]:
        return [layer for layer in self.cache.layers if getattr(layer, "is_initialized", False)]

    def allowed(self, q_pos: torch.Tensor, attend: torch.Tensor, q_valid: torch.Tensor,
                sliding_window: int | None = None, cached_attend: torch.Tensor | None = None) -> torch.Tensor:
        """bool ``[B, 1, N, S + N]``: which cached and new slots each new query may attend.

        Args:
            q_pos: ``[B, N]`` absolute positions of the new tokens.
            attend: ``[B, N, N]`` bool, new-token-to-new-token visibility (tree ancestors, self included).
            q_valid: ``[B, N]`` bool; invalid (padding) queries see only themselves.
            sliding_window: if set, a key is visible only when ``q_pos - k_pos < sliding_window``.
            cached_attend: ``[B, N, S]`` bool extra restriction on cached slots (uncommitted drafter tree nodes).
        """
        return self.masks(q_pos, attend, q_valid, [sliding_window], cached_attend, None)[0]

    def masks(self, q_pos: torch.Tensor, attend: torch.Tensor, q_valid: torch.Tensor,
              windows: Sequence[int | None], cached_attend: torch.Tensor | None = None,
              dtype: torch.dtype | None = None) -> list[torch.Tensor]:
        """One ``[B, 1, N, S + N]`` mask per entry of ``windows`` (``None``: full): bool, or additive of ``dtype``."""
        return tree_masks(self.pos, self.valid, q_pos, attend, q_valid, windows, cached_attend, dtype)

    def mask(self, q_pos: torch.Tensor, attend: torch.Tensor, q_valid: torch.Tensor, dtype: torch.dtype,
             sliding_window: int | None = None, cached_attend: torch.Tensor | None = None) -> torch.Tensor:
        """Additive float mask ``[B, 1, N, S + N]`` for eager/sdpa attention (see :meth:`allowed`)."""
        return self.masks(q_pos, attend, q_valid, [sliding_window], cached_attend, dtype)[0]

    def append(self, q_pos: torch.Tensor, q_valid: torch.Tensor) -> None:
        """Record ``N`` slots that a forward pass just appended to every cache layer."""
        n = q_pos.shape[1]
        end = self._len + n
        if end > self._pos.shape[1]:
            cap = max(end, 2 * self._pos.shape[1])
            pos = self._pos.new_zeros(self._pos.shape[0], cap)
            valid = self._valid.new_zeros(self._valid.shape[0], cap)
            pos.narrow(1, 0, self._len).copy_(self.pos)
            valid.narrow(1, 0, self._len).copy_(self.valid)
            self._pos, self._valid = pos, valid
        self._pos.narrow(1, self._len, n).copy_(q_pos)
        self._valid.narrow(1, self._len, n).copy_(q_valid)
        self._len = end

    def keep_last(self, n_new: int, keep: torch.Tensor | Sequence[Sequence[int]]) -> None:
        """Keep all older slots and, of the last pass's ``n_new``, those in ``keep`` (``[B, n_new]`` bool, or per
        row ascending offsets). Kept slots keep their order and move to the front of that region (only it is read
        and written); with ``B > 1``, rows that keep fewer end with invalid padding slots."""
        if isinstance(keep, torch.Tensor):
            flags = keep.tolist()
            keep = [[j for j, f in enumerate(row) if f] for row in flags]
        s_old = self._len - n_new
        counts = [len(row) for row in keep]
        top = max(counts, default=0)
        if all(list(row) == list(range(len(row))) for row in keep):  # a prefix per row: nothing moves
            self._truncate(s_old + top)
        elif len(keep) == 1:
            src = torch.tensor(list(keep[0]), dtype=torch.long)
            for layer in self._layers():
                layer.move(s_old, src)
            dev = self._pos.device
            for buf in (self._pos, self._valid):
                buf.narrow(1, s_old, top).copy_(buf.narrow(1, s_old, n_new).index_select(1, src.to(dev)))
            self._len = s_old + top
        else:
            order = [list(row) + sorted(set(range(n_new)) - set(row)) for row in keep]
            idx = torch.tensor(order, dtype=torch.long)
            for layer in self._layers():
                layer.compact(s_old, idx, s_old + top)
            idx = idx.to(self._pos.device)
            for buf in (self._pos, self._valid):
                region = buf.narrow(1, s_old, n_new)
                region.copy_(region.gather(1, idx))
            self._len = s_old + top
        if len(keep) > 1 and min(counts) < top:  # shorter rows: their tail slots are padding
            tail = torch.arange(top)[None, :] >= torch.tensor(counts)[:, None]
            region = self._valid.narrow(1, s_old, top)
            region.masked_fill_(tail.to(region.device), False)

    def drop_last(self, n: int) -> None:
        """Forget the last ``n`` slots (e.g. an uncommitted look-ahead pass)."""
        self._truncate(self._len - n)

    def _truncate(self, length: int) -> None:
        for layer in self._layers():
            layer.truncate(length)
        self._len = length
