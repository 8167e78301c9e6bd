# SPDX-License-Identifier: Apache-2.0
"""Analysis of decoding steps (unique experts, cumulative unions, predictor overlap), run after the timed region."""

from __future__ import annotations

import torch

__all__ = ["experts_per_layer", "routing_stats", "prediction_overlap"]


def experts_per_layer(routing: torch.Tensor, valid: torch.Tensor, num_experts: int) -> list[int]:
    """Unique experts per MoE layer over valid tokens: ``routing [B, M, L, K]``, ``valid [B, M]``."""
    r = routing[valid]  # [T, L, K]
    if r.numel() == 0:
        return [0] * routing.shape[2]
    n_layers = r.shape[1]
    hits = torch.zeros(n_layers, num_experts + 1, dtype=torch.bool, device=r.device)
    hits.scatter_(1, r.permute(1, 0, 2).reshape(n_layers, -1).clamp(max=num_experts), True)
    return hits[:, :num_experts].sum(dim=1).tolist()


def routing_stats(routing: torch.Tensor, valid: torch.Tensor, num_experts: int) -> tuple[list[float], torch.Tensor]:
    """Cumulative E over the first k tokens (k = 1..M) and per-expert activation counts ``[L, E]`` of
    ``routing [B, M, L, K]`` over ``valid [B, M]``."""
    b, m, n_layers, _ = routing.shape
    hits = torch.zeros(b, m, n_layers, num_experts + 1, dtype=torch.bool, device=routing.device)
    hits.scatter_(-1, routing.clamp(max=num_experts), True)
    hits = hits[..., :num_experts] & valid[:, :, None, None]
    cum = hits.cummax(dim=1).values.any(dim=0)  # [M, L, E]
    cumulative = cum.sum(dim=-1).float().mean(dim=-1).tolist()
    return cumulative, hits.sum(dim=(0, 1))


def prediction_overlap(experts: torch.Tensor, order: torch.Tensor, valid: torch.Tensor,
                       routing: torch.Tensor) -> tuple[int, int]:
    """Top-K overlap ``(hits, total = valid tokens x L x K)`` of predicted ``experts [B, N, L, E]`` (pool) and
    the router's ``routing [B, M, L, K]`` at the verified nodes (``order [B, M]`` pool indices, ``valid [B, M]``)."""
    b, m = order.shape
    pred = experts.gather(1, order[:, :, None, None].expand(b, m, *experts.shape[2:]))  # [B, M, L, E]
    hit = pred.gather(-1, routing) & valid[:, :, None, None]
    return int(hit.sum()), int(valid.sum()) * routing.shape[2] * routing.shape[3]
