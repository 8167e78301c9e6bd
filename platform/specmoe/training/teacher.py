# SPDX-License-Identifier: Apache-2.0
"""The frozen target as the teacher of a drafter: its features and logits on a batch of training sequences."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

if TYPE_CHECKING:
    from specmoe.interfaces.target import Target

__all__ = ["teacher_forward"]


@torch.no_grad()
def teacher_forward(target: Target, input_ids: torch.Tensor, valid: torch.Tensor, layers: Sequence[int],
                    out_device: torch.device, logits: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The frozen target on a right-padded batch ``input_ids, valid [B, L]`` (standard causal pass, no cache,
    autocast off) -> ``(features [B, L, len(layers) * H], logits [B, L, V] float32)`` on ``out_device``.
    ``layers``: ``hidden_states`` indices to concatenate (0 = embeddings, -1 = the final normalized state);
    ``logits=False``: ``None`` instead, the LM head skipped."""
    dev = target.device
    ids = input_ids.to(dev)
    positions = torch.arange(ids.shape[1], device=dev).expand_as(ids)
    with torch.autocast(device_type=dev.type, enabled=False):
        out = target.forward_standard(ids, valid.to(dev).long(), positions, hidden_layers=list(layers),
                                      compute_logits=logits)
    return out.hidden.to(out_device), out.logits.to(out_device) if logits else None
