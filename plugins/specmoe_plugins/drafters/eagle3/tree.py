# SPDX-License-Identifier: Apache-2.0
"""EAGLE-2/3 candidate pool of an EAGLE-3 draft over a KV context (inference and GTO training).

The root's draft distribution comes from the last context step (the pair of the root token with the target
feature before it). Each deeper level is one :meth:`Eagle3Model.step` over the ``top_k`` frontier nodes:
input ``(node token, output hidden of its parent)``, position ``root_pos + depth``, attending to the context
and to the node's own processed ancestors only. Tree keys live in temporaries that are dropped afterwards, so
the caller's context holds only accepted tokens (EAGLE's ``stable_kv``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specmoe.decoding.tree_builder import build_pool, pool_size, proposer_features
from specmoe.interfaces.tree import DraftTree
from specmoe_plugins.drafters.eagle3.model import Eagle3Model

__all__ = ["TreeContext", "draft_pool"]


@dataclass
class TreeContext:
    """What the tree's nodes attend to besides their ancestors.

    Attributes:
        k, v: ``[B, Hkv, S, D]`` cached keys / values (RoPE applied).
        allowed: ``[B, S]`` bool, the context slots every node of row ``b`` may see.
    """

    k: torch.Tensor
    v: torch.Tensor
    allowed: torch.Tensor


@torch.no_grad()
def draft_pool(model: Eagle3Model, ctx: TreeContext, root_tokens: torch.Tensor, root_hidden: torch.Tensor,
               root_logp: torch.Tensor, root_pos: torch.Tensor, steps: int, top_k: int,
               prev_hidden: torch.Tensor | None = None) -> DraftTree:
    """Build the pool (``1 + top_k + (steps - 1) * top_k**2`` nodes) with ``steps - 1`` draft forwards.

    Args:
        ctx: the context (must already contain the root's own step).
        root_tokens: ``[B]`` target ids; root_hidden: ``[B, H]`` output of the root's step;
        root_logp: ``[B, Vd]`` draft log-probabilities after the root;
        root_pos: ``[B]`` the root step's position.
        prev_hidden: ``[B, H]`` output of the step before the root's; when given, the tree carries
            ``features`` (each node's proposing step output, :func:`proposer_features`).
    """
    bsz = root_tokens.shape[0]
    dev = root_tokens.device
    n_pool = pool_size(steps, top_k)
    node_hidden = root_hidden.new_zeros(bsz, n_pool, root_hidden.shape[-1])
    node_hidden[:, 0] = root_hidden
    ar_b = torch.arange(bsz, device=dev)[:, None]
    ar_pool = torch.arange(n_pool, device=dev)
    tmp_k: list[torch.Tensor] = []
    tmp_v: list[torch.Tensor] = []
    done: list[torch.Tensor] = []  # pool indices of the nodes whose keys are in tmp_k, in order

    def expand(tokens: torch.Tensor, pool_idx: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
        k = tokens.shape[1]
        parent = (ancestors.long() * ar_pool).argmax(dim=-1)  # deepest strict ancestor = largest index
        hidden = node_hidden[ar_b, parent]
        pos = root_pos[:, None] + ancestors.sum(dim=-1)
        parts = [ctx.allowed[:, None, :].expand(bsz, k, ctx.allowed.shape[1])]
        past_k, past_v = ctx.k, ctx.v
        if done:
            prev = torch.cat(done, dim=1)
            parts.append(ancestors.gather(2, prev[:, None, :].expand(bsz, k, prev.shape[1])))
            past_k = torch.cat([ctx.k, *tmp_k], dim=2)
            past_v = torch.cat([ctx.v, *tmp_v], dim=2)
        parts.append(torch.eye(k, dtype=torch.bool, device=dev).expand(bsz, k, k))
        out, nk, nv = model.step(tokens, hidden, pos, past_k, past_v, torch.cat(parts, dim=2))
        node_hidden[ar_b, pool_idx] = out
        tmp_k.append(nk)
        tmp_v.append(nv)
        done.append(pool_idx)
        return torch.log_softmax(model.logits(out), dim=-1)

    tree = build_pool(root_tokens, root_logp, expand, steps, top_k, to_target=model.to_target)
    if prev_hidden is not None:
        tree.features = proposer_features(tree.parents, node_hidden, prev_hidden)
    return tree
