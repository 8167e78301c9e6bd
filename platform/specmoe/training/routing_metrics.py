# SPDX-License-Identifier: Apache-2.0
"""The expert predictor's objective (paper eq. 5-6) and its "routing prediction accuracy" (App. B.1).

* Target distribution (eq. 5): for token ``t`` and MoE layer ``l``, ``q[t, l, e] = 1/K`` when expert ``e`` is
  one of the router's top-K, else 0.
* Loss (eq. 6): ``-sum_t sum_l sum_e q[t, l, e] log softmax(z[t, l])[e]``, returned as a sum and a term count
  (callers average over any set of tokens, e.g. the global batch under DDP).
* Accuracy: ``|TopK(p_hat[t, l]) & E_gt(t, l)| / K`` averaged over tokens and layers (also per layer).
"""

from __future__ import annotations

import torch
from torchmetrics import Metric

__all__ = ["routing_targets", "routing_loss", "topk_sets", "topk_overlap", "TopKRoutingAccuracy"]


def routing_targets(routing: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``[..., L, K]`` expert ids -> ``[..., L, E]`` float: ``1/K`` on the chosen experts (eq. 5)."""
    k = routing.shape[-1]
    q = torch.zeros(*routing.shape[:-1], num_experts, dtype=torch.float32, device=routing.device)
    return q.scatter_(-1, routing.long(), 1.0 / k)


def routing_loss(logits: torch.Tensor, routing: torch.Tensor,
                 valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer-wise cross-entropy of ``logits [..., L, E]`` against uniform mass on the router's top-K ``routing
    [..., L, K]`` (eq. 6), over ``valid [...]`` tokens -> ``(loss_sum, terms)`` float32 scalars: the summed loss
    and the number of (token, layer) terms in it."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    q = routing_targets(routing, logits.shape[-1])
    ce = -(q * logp).sum(dim=-1)  # [..., L]
    ce = ce * valid[..., None].to(ce.dtype)
    terms = valid.sum().to(torch.float32) * logits.shape[-2]
    return ce.sum(), terms


def topk_sets(logits: torch.Tensor, k: int) -> torch.Tensor:
    """``[..., L, E]`` logits -> ``[..., L, E]`` bool: the ``k`` highest experts per layer (eq. 4)."""
    idx = logits.topk(k, dim=-1).indices
    return torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, idx, True)


def topk_overlap(pred_sets: torch.Tensor, routing: torch.Tensor) -> torch.Tensor:
    """``|pred & gt|`` per token and layer: ``pred_sets [..., L, E]`` bool, ``routing [..., L, K]`` expert ids
    -> ``[..., L]`` int64."""
    return pred_sets.gather(-1, routing.long()).sum(dim=-1)


class TopKRoutingAccuracy(Metric):
    """Top-K routing prediction accuracy over ``num_layers`` layers and ``top_k`` experts per token, overall and
    per layer; exact under DDP (summed counts)."""

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, num_layers: int, top_k: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.top_k = top_k
        self.add_state("hits", default=torch.zeros(num_layers, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("tokens", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, pred: torch.Tensor, routing: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        """Add a batch: ``pred [..., L, E]`` logits (their top-K is the prediction) or bool expert sets,
        ``routing [..., L, K]`` ground-truth ids, ``valid [...]`` bool mask of real tokens (default: all)."""
        sets = pred if pred.dtype == torch.bool else topk_sets(pred, self.top_k)
        overlap = topk_overlap(sets, routing)  # [..., L]
        if valid is None:
            valid = torch.ones(overlap.shape[:-1], dtype=torch.bool, device=overlap.device)
        overlap = overlap[valid]  # [T, L]
        self.hits += overlap.sum(dim=0).long()
        self.tokens += int(valid.sum())

    def compute(self) -> dict[str, torch.Tensor]:
        """``{"acc": scalar, "acc_per_layer": [L]}`` (NaN-free: 0 before any token)."""
        denom = (self.tokens * self.top_k).clamp(min=1).to(torch.float64)
        per_layer = (self.hits.to(torch.float64) / denom).float()
        return {"acc": per_layer.mean(), "acc_per_layer": per_layer}
