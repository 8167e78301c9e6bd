# SPDX-License-Identifier: Apache-2.0
"""EAGLE-2/3 candidate pool of an EAGLE-3 draft over a KV context (inference and GTO training).

The root's draft distribution comes from the last context step (the pair of the root token with the target
feature before it). Each deeper level is one :meth:`Eagle3Model.step_into` over the frontier nodes (``width``
of them, default ``top_k``): input ``(node token, output hidden of its parent)``, position ``root_pos + depth``,
attending to the context and to the node's own processed ancestors only. Tree keys are written into the context
buffer's free slots after the context and forgotten afterwards (the length is reset; nothing is copied), so the
context holds only accepted tokens (EAGLE's ``stable_kv``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from specmoe.decoding.tree_builder import build_pool, pool_size, proposer_features
from specmoe.interfaces.tree import DraftTree
from specmoe_plugins.drafters.eagle3.model import Eagle3Model

__all__ = ["TreeContext", "draft_pool"]


def _grown(buf: torch.Tensor, length: int, need: int, dim: int) -> torch.Tensor:
    cap = max(need, 2 * buf.shape[dim])
    shape = list(buf.shape)
    shape[dim] = cap
    out = buf.new_zeros(shape)
    out.narrow(dim, 0, length).copy_(buf.narrow(dim, 0, length))
    return out


@dataclass
class TreeContext:
    """The draft's keys / values in preallocated buffers, written in place, and what the tree nodes see.

    Attributes:
        k, v: ``[B, Hkv, C, D]`` buffers (RoPE applied); the first ``length`` slots are the context.
        allowed: ``[B, C]`` bool, the context slots every node of row ``b`` may see.
        length: slots in use.
    """

    k: torch.Tensor
    v: torch.Tensor
    allowed: torch.Tensor
    length: int

    @classmethod
    def wrap(cls, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, room: int = 0) -> "TreeContext":
        """A context holding ``k, v [B, Hkv, S, D]`` and ``allowed [B, S]`` with ``room`` free slots after it."""
        ctx = cls(k, v, allowed, k.shape[2])
        ctx.reserve(room)
        return ctx

    def reserve(self, room: int) -> None:
        """Make sure ``room`` slots after :attr:`length` are allocated (grows the buffers by doubling)."""
        need = self.length + room
        if need > self.k.shape[2]:
            self.k = _grown(self.k, self.length, need, 2)
            self.v = _grown(self.v, self.length, need, 2)
        if need > self.allowed.shape[1]:
            self.allowed = _grown(self.allowed, self.length, need, 1)

    def append(self, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> None:
        """Write ``[B, Hkv, N, D]`` keys / values and ``[B, N]`` visibility after the context."""
        n = k.shape[2]
        self.reserve(n)
        self.k.narrow(2, self.length, n).copy_(k)
        self.v.narrow(2, self.length, n).copy_(v)
        self.allowed.narrow(1, self.length, n).copy_(allowed)
        self.length += n


@torch.no_grad()
def draft_pool(model: Eagle3Model, ctx: TreeContext, root_tokens: torch.Tensor, root_hidden: torch.Tensor,
               root_logp: torch.Tensor, root_pos: torch.Tensor, steps: int, top_k: int,
               prev_hidden: torch.Tensor | None = None, width: int | None = None) -> DraftTree:
    """Build the pool (``1 + top_k + (steps - 1) * width * top_k`` nodes, :func:`build_pool`) with ``steps - 1``
    draft forwards over ``width`` frontier nodes each (default ``top_k``: EAGLE-2/3).

    Args:
        ctx: the context (must already contain the root's own step); its free slots hold the tree's keys while
            the pool is built, its length is unchanged afterwards.
        root_tokens: ``[B]`` target ids; root_hidden: ``[B, H]`` output of the root's step;
        root_logp: ``[B, Vd]`` draft log-probabilities after the root;
        root_pos: ``[B]`` the root step's position.
        prev_hidden: ``[B, H]`` output of the step before the root's; when given, the tree carries
            ``features`` (each node's proposing step output, :func:`proposer_features`).
    """
    if steps >= 2 and min(width or top_k, top_k) == 1:  # frontier width one: one compiled call where it runs
        ctx.reserve(steps - 1)
        got = model.chain_logp(root_hidden, root_logp, root_pos, ctx.k, ctx.v, ctx.allowed.narrow(1, 0, ctx.length),
                               steps, top_k)
        if got is not None:
            return _chain_tree(root_tokens, root_hidden, prev_hidden, *got)
    bsz = root_tokens.shape[0]
    dev = root_tokens.device
    n_pool = pool_size(steps, top_k, width)
    node_hidden = root_hidden.new_zeros(bsz, n_pool, root_hidden.shape[-1])
    node_hidden[:, 0] = root_hidden
    ar_b = torch.arange(bsz, device=dev)[:, None]
    ar_pool = torch.arange(n_pool, device=dev)
    n_ctx = ctx.length
    ctx.reserve(max(steps - 1, 0) * min(width or top_k, top_k))
    context = ctx.allowed.narrow(1, 0, n_ctx)
    done: list[torch.Tensor] = []  # pool indices of the nodes whose keys follow the context, in order

    def expand(tokens: torch.Tensor, pool_idx: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor:
        k = tokens.shape[1]
        parent = (ancestors.long() * ar_pool).argmax(dim=-1)  # deepest strict ancestor = largest index
        hidden = node_hidden[ar_b, parent]
        pos = root_pos[:, None] + ancestors.sum(dim=-1)
        parts = [context[:, None, :].expand(bsz, k, n_ctx)]
        if done:
            prev = torch.cat(done, dim=1)
            parts.append(ancestors.gather(2, prev[:, None, :].expand(bsz, k, prev.shape[1])))
        parts.append(torch.eye(k, dtype=torch.bool, device=dev).expand(bsz, k, k))
        start = n_ctx + k * len(done)
        out, logp = model.step_logp(tokens, hidden, pos, ctx.k, ctx.v, start, torch.cat(parts, dim=2))
        node_hidden[ar_b, pool_idx] = out
        done.append(pool_idx)
        return logp

    tree = build_pool(root_tokens, root_logp, expand, steps, top_k, to_target=model.to_target, width=width)
    if prev_hidden is not None:
        tree.features = proposer_features(tree.parents, node_hidden, prev_hidden)
    return tree


@lru_cache(maxsize=64)
def _width_one(steps: int, top_k: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """``(parents [N], depth [N], anc [N, N])`` of :func:`build_pool`'s pool at frontier width one: level ``L``
    holds nodes ``1 + (L - 1) * top_k ..`` (likeliest first), the children of level ``L - 1``'s first node. Built
    once per shape (read only: the tree gets copies)."""
    n = 1 + steps * top_k
    level = torch.arange(n, device=device).sub(1).div(top_k, rounding_mode="floor")  # 0-based level, -1 at root
    first = 1 + (level - 1) * top_k  # the previous level's first node
    parents = torch.where(level <= 0, torch.zeros_like(level), first)
    parents[0] = -1
    depth = level + 1
    nodes = torch.arange(n, device=device)
    is_first = (nodes - 1) % top_k == 0
    # ancestor-or-self: the root, the first nodes of the levels above, itself
    anc = (nodes[None, :] == 0) | (is_first[None, :] & (depth[None, :] < depth[:, None])) | torch.eye(
        n, dtype=torch.bool, device=device)
    return parents, depth, anc


def _chain_tree(root_tokens: torch.Tensor, root_hidden: torch.Tensor, prev_hidden: torch.Tensor | None,
                tokens: torch.Tensor, logp: torch.Tensor, hidden: torch.Tensor) -> DraftTree:
    """The pool :func:`build_pool` builds at frontier width one from :meth:`Eagle3Model.chain_logp`'s outputs
    (``tokens, logp [B, steps, top_k]``, ``hidden [B, steps - 1, H]``)."""
    bsz, steps, top_k = tokens.shape
    dev = tokens.device
    parents, depth, anc = _width_one(steps, top_k, dev)
    n = parents.shape[0]
    prefix = torch.cat([logp.new_zeros(bsz, 1), logp[:, :-1, 0].cumsum(1)], dim=1)  # the path to each level
    zero = logp.new_zeros(bsz, 1)
    parents_b = parents.expand(bsz, n).contiguous()
    tree = DraftTree(tokens=torch.cat([root_tokens[:, None], tokens.reshape(bsz, -1)], dim=1), parents=parents_b,
                     depth=depth.expand(bsz, n).contiguous(), logp=torch.cat([zero, logp.reshape(bsz, -1)], dim=1),
                     path_logp=torch.cat([zero, (prefix[:, :, None] + logp).reshape(bsz, -1)], dim=1),
                     valid=torch.ones(bsz, n, dtype=torch.bool, device=dev), anc=anc.expand(bsz, n, n).contiguous())
    if prev_hidden is not None:  # the expanded nodes' states: the root and each level's first node
        states = hidden.new_zeros(bsz, n, hidden.shape[-1])
        states[:, 0] = root_hidden
        states[:, 1:1 + (steps - 1) * top_k:top_k] = hidden
        tree.features = proposer_features(parents_b, states, prev_hidden)
    return tree
