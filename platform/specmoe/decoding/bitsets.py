# SPDX-License-Identifier: Apache-2.0
"""Packed expert sets: ``[..., L, E]`` bool -> ``[..., W]`` uint64 words (``W = ceil(L * E / 64)``).

(layer, expert) is bit ``l * E + e``: a union is ``|``, a marginal cost ``|path \\ buffer|`` is
``popcount(path & ~buffer)``. Packing copies once from the device; the rest is host numpy.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["pack_sets", "pack_bytes_torch", "popcount_rows", "path_unions"]


def pack_sets(sets: torch.Tensor) -> np.ndarray:
    """``[..., L, E]`` bool (any device) -> ``[..., W]`` uint64 (host), zero-padded to whole words (packed on
    the device first off the CPU)."""
    lead = tuple(sets.shape[:-2])
    bits = sets.shape[-2] * sets.shape[-1]
    flat = sets.detach().reshape(-1, bits)
    if flat.device.type == "cpu":
        packed = np.packbits(flat.to(torch.bool).numpy(), axis=-1, bitorder="little")
    else:
        packed = pack_bytes_torch(flat).cpu().numpy()
    pad = (-packed.shape[1]) % 8
    if pad:
        packed = np.pad(packed, ((0, 0), (0, pad)))
    return np.ascontiguousarray(packed).view(np.uint64).reshape(*lead, -1)


def pack_bytes_torch(flat: torch.Tensor) -> torch.Tensor:
    """``[M, bits]`` bool -> ``[M, ceil(bits / 8)]`` uint8 on the same device, as ``np.packbits(..., "little")``."""
    m, bits = flat.shape
    pad = (-bits) % 8
    x = torch.nn.functional.pad(flat.to(torch.uint8), (0, pad)).view(m, -1, 8)
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.int32, device=flat.device)
    return (x.to(torch.int32) * weights).sum(dim=-1).to(torch.uint8)


def popcount_rows(words: np.ndarray) -> np.ndarray:
    """``[..., W]`` uint64 -> ``[...]`` int64: set bits per row."""
    return np.add.reduce(np.bitwise_count(words), axis=-1, dtype=np.int64)


def path_unions(sets: np.ndarray, parents: np.ndarray, depth: np.ndarray,
                valid: np.ndarray | None = None) -> np.ndarray:
    """``[B, N, W]`` uint64 union of the packed sets on each root-to-node path.

    Args:
        sets: ``[B, N, W]`` uint64 per-node sets.
        parents: ``[B, N]`` int64 parent index (``-1`` at the root; if ``depth`` disagrees, before children).
        depth: ``[B, N]`` int64 node depth (0 at the root).
        valid: ``[B, N]`` bool; padding nodes' unions are unspecified (default: every node is valid).
    """
    b, n, w = sets.shape
    out = sets.reshape(b * n, w).copy()
    base = (np.arange(b, dtype=np.int64) * n)[:, None]
    has_par = parents >= 0
    par_flat = np.where(has_par, parents + base, 0).reshape(-1)
    dep = depth.reshape(-1)
    hp = has_par.reshape(-1)
    chk = hp if valid is None else hp & valid.reshape(-1)
    if np.array_equal(dep[chk], dep[par_flat[chk]] + 1) and not dep[~hp].any():
        order = np.argsort(dep, kind="stable")
        bounds = np.searchsorted(dep[order], np.arange(1, int(dep.max(initial=0)) + 2))
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            f = order[lo:hi]
            out[f] |= out[par_flat[f]]
    else:
        for i in range(1, n):
            rows = np.flatnonzero(has_par[:, i])
            f = rows * n + i
            out[f] |= out[par_flat[f]]
    return out.reshape(b, n, w)
