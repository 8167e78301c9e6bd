# SPDX-License-Identifier: Apache-2.0
"""Expert-set helpers: top-k indices <-> boolean ``[..., L, E]`` membership tensors."""

from __future__ import annotations

import torch

__all__ = ["indices_to_sets", "topk_mask", "union_size_per_layer"]


def indices_to_sets(indices: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``[..., L, K]`` int64 expert ids -> ``[..., L, E]`` bool membership."""
    out = torch.zeros(*indices.shape[:-1], num_experts, dtype=torch.bool, device=indices.device)
    return out.scatter_(-1, indices.long(), True)


def topk_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """``[..., E]`` finite float scores -> ``[..., E]`` bool: the ``k`` highest of each row, as
    ``indices_to_sets(scores.topk(k).indices)`` but by ``k`` max-reductions (faster on CPU); ties use ``topk``."""
    x = scores.clone()
    for _ in range(k - 1):
        y = x - x.amax(dim=-1, keepdim=True)  # 0 at the row maximum, < 0 elsewhere
        x.add_(y.sign_().add_(1.0), alpha=-1e30)
    mask = scores >= x.amax(dim=-1, keepdim=True)
    # every row has >= k hits; more means a tie
    if int(mask.sum()) != k * (mask.numel() // max(mask.shape[-1], 1)):
        mask = indices_to_sets(scores.topk(k, dim=-1).indices, scores.shape[-1])
    return mask


def union_size_per_layer(sets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sets [B, N, L, E]`` bool, ``mask [B, N]`` bool -> ``[L]`` unique experts over masked nodes."""
    return (sets & mask[:, :, None, None]).any(dim=1).any(dim=0).sum(dim=-1)
