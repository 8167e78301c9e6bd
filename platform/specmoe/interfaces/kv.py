# SPDX-License-Identifier: Apache-2.0
"""KV cache state for tree decoding on Hugging Face models (targets and HF draft models).

Every cache layer is a full (non-sliding) ``DynamicLayer``; sliding-window attention is applied through the
mask from the absolute position of every cached slot. This keeps pruning after acceptance one gather per
layer for all layer kinds (a sliding ``DynamicSlidingWindowLayer`` would already have dropped context that
a rejected tree token displaced).

Slots are tracked per row: ``pos [B, S]`` (absolute position) and ``valid [B, S]``, so rows of a batch
may hold different numbers of committed tokens (padding slots are masked out).
"""

from __future__ import annotations

import torch

__all__ = ["KVState", "additive_mask"]


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool ``[...]`` -> float mask with 0 where allowed and ``finfo(dtype).min`` elsewhere."""
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)


class KVState:
    """A ``transformers`` ``DynamicCache`` plus the position and validity of each cached slot.

    Args:
        batch_size: rows ``B``.
        device: where the position/validity tensors live.
    """

    def __init__(self, batch_size: int, device: torch.device | str = "cpu") -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.pos = torch.zeros(batch_size, 0, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)

    @property
    def batch_size(self) -> int:
        return int(self.pos.shape[0])

    @property
    def num_slots(self) -> int:
        return int(self.pos.shape[1])

    def next_position(self) -> torch.Tensor:
        """``[B]`` the position of the next token of each row (number of committed valid tokens)."""
        return self.valid.sum(dim=1)

    # ---------------------------------------------------------------- masks
    def allowed(self, q_pos: torch.Tensor, attend: torch.Tensor, q_valid: torch.Tensor,
                sliding_window: int | None = None, cached_attend: torch.Tensor | None = None) -> torch.Tensor:
        """bool ``[B, 1, N, S + N]``: which cached and new slots each new query may attend.

        Args:
            q_pos: ``[B, N]`` absolute positions of the new tokens.
            attend: ``[B, N, N]`` bool, new-token-to-new-token visibility (tree ancestors, self included).
            q_valid: ``[B, N]`` bool; invalid (padding) queries see only themselves.
            sliding_window: if set, a key is visible only when ``q_pos - k_pos < sliding_window``.
            cached_attend: ``[B, N, S]`` bool, extra restriction on cached slots (drafters keep uncommitted
                tree nodes in the cache while they expand a tree; a node sees only its own ancestors).
        """
        b, n = q_pos.shape
        old = self.valid[:, None, :].expand(b, n, self.num_slots)
        if cached_attend is not None:
            old = old & cached_attend
        new = attend & q_valid[:, None, :]
        if sliding_window is not None:
            old = old & ((q_pos[:, :, None] - self.pos[:, None, :]) < sliding_window)
            new = new & ((q_pos[:, :, None] - q_pos[:, None, :]) < sliding_window)
        eye = torch.eye(n, dtype=torch.bool, device=q_pos.device)[None]
        new = new | (eye & ~q_valid[:, :, None])
        old = old & q_valid[:, :, None]
        return torch.cat([old, new], dim=2)[:, None]

    def mask(self, q_pos: torch.Tensor, attend: torch.Tensor, q_valid: torch.Tensor, dtype: torch.dtype,
             sliding_window: int | None = None, cached_attend: torch.Tensor | None = None) -> torch.Tensor:
        """Additive float mask ``[B, 1, N, S + N]`` for eager/sdpa attention (see :meth:`allowed`)."""
        return additive_mask(self.allowed(q_pos, attend, q_valid, sliding_window, cached_attend), dtype)

    # ---------------------------------------------------------------- bookkeeping
    def append(self, q_pos: torch.Tensor, q_valid: torch.Tensor) -> None:
        """Record ``N`` slots that a forward pass just appended to every cache layer."""
        self.pos = torch.cat([self.pos, q_pos], dim=1)
        self.valid = torch.cat([self.valid, q_valid], dim=1)

    def _layers(self):
        return [layer for layer in self.cache.layers if getattr(layer, "keys", None) is not None
                and layer.keys.numel() > 0]

    def keep_last(self, n_new: int, keep: torch.Tensor) -> None:
        """Keep all older slots and, of the last ``n_new`` slots, those where ``keep [B, n_new]`` is True.

        Kept slots stay in their order (tree node order is parent-before-child, so an accepted path keeps
        its order). With ``B > 1`` every row is left-compacted and rows that keep fewer slots end with invalid
        padding slots.
        """
        s_old = self.num_slots - n_new
        b = self.batch_size
        if b == 1:
            idx_new = keep[0].nonzero().squeeze(1)
            a = int(idx_new.numel())
            if a == 0 or bool((idx_new == torch.arange(a, device=idx_new.device)).all()):
                self._crop(s_old + a)
                return
            index = torch.cat([torch.arange(s_old, device=keep.device), s_old + idx_new])[None]
            self._gather(index, torch.ones_like(index, dtype=torch.bool))
            return
        full = torch.cat([self.valid[:, :s_old], keep & self.valid[:, s_old:]], dim=1)
        counts = full.sum(dim=1)
        m = int(counts.max())
        index = torch.argsort((~full).to(torch.int8), dim=1, stable=True)[:, :m]  # kept slots first, in order
        index_valid = torch.arange(m, device=keep.device)[None, :] < counts[:, None]
        self._gather(index, index_valid)

    def drop_last(self, n: int) -> None:
        """Forget the last ``n`` slots (e.g. after a look-ahead pass whose results are not committed)."""
        self._crop(self.num_slots - n)

    def _crop(self, length: int) -> None:
        for layer in self._layers():
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]
        self.pos = self.pos[:, :length]
        self.valid = self.valid[:, :length]

    def _gather(self, index: torch.Tensor, index_valid: torch.Tensor) -> None:
        """Row-wise gather of slots ``index [B, M]``; ``index_valid [B, M]`` marks the real ones."""
        for layer in self._layers():
            for name in ("keys", "values"):
                t = getattr(layer, name)
                idx = index.to(t.device)[:, None, :, None].expand(t.shape[0], t.shape[1], index.shape[1],
                                                                  t.shape[3])
                setattr(layer, name, t.gather(2, idx))
        self.pos = self.pos.gather(1, index)
        self.valid = self.valid.gather(1, index) & index_valid
