# SPDX-License-Identifier: Apache-2.0
"""Expert-set helpers: top-k indices <-> boolean ``[..., L, E]`` membership tensors."""

from __future__ import annotations

import torch

__all__ = ["indices_to_sets", "union_size_per_layer"]


def indices_to_sets(indices: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``[..., L, K]`` int64 expert ids -> ``[..., L, E]`` bool membership."""
    out = torch.zeros(*indices.shape[:-1], num_experts, dtype=torch.bool, device=indices.device)
    return out.scatter_(-1, indices.long(), True)


def union_size_per_layer(sets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sets [B, N, L, E]`` bool, ``mask [B, N]`` bool -> ``[L]`` unique experts over masked nodes."""
    return (sets & mask[:, :, None, None]).any(dim=1).any(dim=0).sum(dim=-1)
