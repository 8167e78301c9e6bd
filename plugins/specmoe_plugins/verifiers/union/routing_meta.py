# SPDX-License-Identifier: Apache-2.0
"""Expert-major routing metadata for the union kernels, built without host synchronisation.

Every output shape depends only on ``(T, K, E)``, never on the routing values, so the sequence can be
captured in a CUDA graph: ``U_max = min(E, T * K)`` union slots are always produced, the unused ones padded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RoutingMeta", "routing_meta"]


@dataclass
class RoutingMeta:
    """Slots ``s = t * K + j`` grouped by expert.

    Attributes:
        perm: ``[S]`` int32 slot ids sorted by expert (stable: token-major inside an expert); sentinel
            slots (ids outside ``[0, E)``) come last and belong to no union slot.
        u_expert: ``[U_max]`` int32 union expert ids in ascending order, ``-1`` for unused union slots.
        u_start: ``[U_max]`` int32 first position in ``perm`` of each union expert's slots.
        u_count: ``[U_max]`` int32 number of slots of each union expert (0 when unused).
    """

    perm: torch.Tensor
    u_expert: torch.Tensor
    u_start: torch.Tensor
    u_count: torch.Tensor

    @property
    def u_max(self) -> int:
        return int(self.u_expert.shape[0])


def routing_meta(top_k_index: torch.Tensor, num_experts: int) -> RoutingMeta:
    """``top_k_index [T, K]`` (any integer dtype) -> :class:`RoutingMeta` (no ``.item()``, no ``unique``)."""
    t, k = top_k_index.shape
    dev = top_k_index.device
    flat = top_k_index.reshape(-1).to(torch.int64)
    key = torch.where((flat >= 0) & (flat < num_experts), flat, torch.full_like(flat, num_experts))
    sorted_key, perm = torch.sort(key, stable=True)
    # bounds[e] = first sorted position with key >= e, for e = 0..E
    bounds = torch.searchsorted(sorted_key, torch.arange(num_experts + 1, device=dev, dtype=torch.int64))
    counts = bounds[1:] - bounds[:-1]  # [E]
    hit = counts > 0
    u_max = min(num_experts, t * k)
    # hit experts first (ascending id), then the others; keep U_max of them
    order = torch.sort((~hit).to(torch.int32), stable=True).indices[:u_max]
    used = hit[order]
    minus_one = torch.full_like(order, -1)
    return RoutingMeta(
        perm=perm.to(torch.int32),
        u_expert=torch.where(used, order, minus_one).to(torch.int32),
        u_start=bounds[:-1][order].to(torch.int32),
        u_count=torch.where(used, counts[order], torch.zeros_like(order)).to(torch.int32),
    )
