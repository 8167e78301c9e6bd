# SPDX-License-Identifier: Apache-2.0
"""Rotary position embeddings for inference passes: a model's own rotary module, its tables computed once.

Where a rotary module's tables depend on the position alone (every type but ``dynamic`` and ``longrope``),
:class:`RopeTables` asks it once for positions ``[0, P)`` (``P`` doubling as needed; asked again when its
frequencies change) and each pass gathers its rows: the same values the module would give. :func:`rotate` applies
them in the rotate-half convention (Llama, Qwen, GPT-OSS).
"""

from __future__ import annotations

import torch

__all__ = ["RopeTables", "rotate", "full_tables"]


def full_tables(cos: torch.Tensor, sin: torch.Tensor, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A rotary module's ``(cos, sin)`` ``[..., D / 2]`` or ``[..., D]`` (the rotate-half convention's
    full-width tables hold each frequency twice) -> full-width ``(cos, sin)`` ``[..., D]`` with ``sin``'s first
    half negated, for :func:`rotate`."""
    c, s = (cos, sin) if cos.shape[-1] == half else (cos[..., :half], sin[..., :half])
    return torch.cat((c, c), dim=-1), torch.cat((-s, s), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary embedding of ``x [..., D]`` with :func:`full_tables` ``cos`` / ``sin`` (broadcast to
    ``x``): ``x * cos + [x2, x1] * sin``, the same products and sums as ``(x1 cos - x2 sin, x2 cos + x1 sin)``
    (a negated product is exact)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


def static(rotary: torch.nn.Module) -> bool:
    """Whether ``rotary``'s tables depend on the position alone, so one table serves every pass."""
    kind = str(getattr(rotary, "rope_type", "default"))
    return "dynamic" not in kind and kind != "longrope" and isinstance(getattr(rotary, "inv_freq", None), torch.Tensor)


class RopeTables:
    """``(cos, sin)`` of :func:`full_tables` for the positions of a pass, from ``rotary`` (a ``transformers``
    rotary module called as ``rotary(x, position_ids)``); ``head_dim``: ``D`` of the rotated heads."""

    def __init__(self, rotary: torch.nn.Module, head_dim: int) -> None:
        self.rotary = rotary
        self.half = head_dim // 2
        self._table: tuple | None = None  # (stamp, cos [P, D], sin [P, D])

    def __call__(self, x: torch.Tensor, positions: torch.Tensor,
                 bound: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: any tensor of the pass's dtype and device; ``positions [B, N]`` -> ``(cos, sin)`` ``[B, 1, N, D]``.

        ``bound``: a host-known bound on the positions (all ``< bound``), so ``positions`` need not be read; without
        it CPUs read the largest position and accelerators ask the module every pass (no host synchronisation)."""
        if not static(self.rotary) or (bound is None and x.device.type != "cpu"):
            cos, sin = full_tables(*self.rotary(x, positions), self.half)
            return cos[:, None], sin[:, None]
        cos, sin = self.table(x, int(positions.max()) + 1 if bound is None else bound)
        return cos[positions][:, None], sin[positions][:, None]

    def table(self, x: torch.Tensor, need: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole tables ``(cos, sin)`` ``[P, D]`` (``P >= need``; a static rotary type only, see
        :func:`static`) for ``x``'s dtype and device: row ``p`` is position ``p``."""
        inv = self.rotary.inv_freq
        stamp = (inv.data_ptr(), inv._version, x.dtype, x.device)
        table = self._table
        if table is None or table[0] != stamp or table[1].shape[0] < need:
            size = max(need, 2 * table[1].shape[0] if table is not None else 0, 256)
            cos, sin = full_tables(*self.rotary(x, torch.arange(size, device=x.device)[None]), self.half)
            table = self._table = (stamp, cos[0], sin[0])
        return table[1], table[2]
