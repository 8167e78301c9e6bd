# SPDX-License-Identifier: Apache-2.0
"""Expert-union-grouped MoE experts in plain PyTorch: the specification of the union kernels.

Per MoE layer call, the experts chosen by the ``T`` verified tokens form the union ``U``. Each union expert
is applied once, with one matmul per projection over all of its tokens (its weights are read once), and the
outputs are scaled by the routing weights and scatter-added in fp32; the result is cast once.
"""

from __future__ import annotations

from typing import Any

import torch

from specmoe.kernels.layout import expert_forward, experts_layout

__all__ = ["union_experts_forward"]


def union_experts_forward(module: Any, hidden: torch.Tensor, top_k_index: torch.Tensor,
                          top_k_weights: torch.Tensor) -> torch.Tensor:
    """Union-grouped experts computation.

    Args:
        module: a ``transformers`` experts module (GPT-OSS, Qwen3-MoE or DeepSeek-V3 layout).
        hidden: ``[T, H]`` MoE input.
        top_k_index: ``[T, K]`` int64 expert ids; rows need not be sorted; ids outside ``[0, E)`` (expert
            parallel sentinels, which carry weight 0) are skipped.
        top_k_weights: ``[T, K]`` routing weights (model dtype, or fp32 for DeepSeek-V3).

    Returns:
        ``[T, H]`` in ``hidden.dtype``.
    """
    layout = experts_layout(module)
    t, k = top_k_index.shape
    n_exp = layout.num_experts
    flat = top_k_index.reshape(-1)
    weights = top_k_weights.reshape(-1)
    # sentinels (and any id outside [0, E)) share the key E and sort last
    key = torch.where((flat >= 0) & (flat < n_exp), flat, torch.full_like(flat, n_exp))
    sorted_key, slots = torch.sort(key, stable=True)
    experts, counts = torch.unique_consecutive(sorted_key, return_counts=True)
    out = torch.zeros(t, layout.hidden, dtype=torch.float32, device=hidden.device)
    for expert, expert_slots in zip(experts.tolist(), slots.split(counts.tolist())):
        if expert == n_exp:
            continue
        tokens = expert_slots // k
        y = expert_forward(module, layout, expert, hidden[tokens])
        out.index_add_(0, tokens, y.float() * weights[expert_slots].float()[:, None])
    return out.to(hidden.dtype)
