# SPDX-License-Identifier: Apache-2.0
"""EAGLE-2/3 dynamic candidate pool, shared by every drafter.

Level 1 takes the root's ``top_k`` tokens; each further level expands the ``width`` best frontier nodes (by
cumulative log-probability, EAGLE-2/3: ``width = top_k``) by ``top_k`` children each and records all of them,
parents before children. ``width = 1`` keeps a chain's drafting cost and still offers each level's runner-ups.
"""

from __future__ import annotations

from typing import Callable

import torch

from specmoe.interfaces.tree import DraftTree

__all__ = ["build_pool", "ExpandFn", "pool_size", "proposer_features"]

#: ``expand(tokens [B, k], pool_index [B, k], ancestors [B, k, P]) -> logp [B, k, V]``: run the drafter on
#: the frontier nodes (target-vocabulary ids; ``V``: draft vocabulary); ``ancestors[b, i, j]``: pool node j is a
#: strict ancestor of frontier node i.
ExpandFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def pool_size(steps: int, top_k: int, width: int | None = None) -> int:
    """Nodes in the pool, root included (``width``: frontier nodes per level, default ``top_k``)."""
    w = top_k if width is None else min(width, top_k)
    return 1 + top_k + max(steps - 1, 0) * w * top_k


def build_pool(root_tokens: torch.Tensor, root_logp: torch.Tensor, expand: ExpandFn, steps: int, top_k: int,
               to_target: Callable[[torch.Tensor], torch.Tensor] | None = None,
               width: int | None = None) -> DraftTree:
    """Build the candidate pool.

    Args:
        root_tokens: ``[B]`` target-vocabulary root tokens.
        root_logp: ``[B, V]`` draft log-probabilities of the token after the root.
        steps: tree levels below the root (the drafter runs ``steps`` forward passes including the root's).
        to_target: maps draft-vocabulary ids to target ids (EAGLE-3 ``d2t``); identity if ``None``.
        width: frontier nodes expanded per level (default and at most ``top_k``).
    """
    if to_target is None:
        to_target = lambda t: t  # noqa: E731
    if steps < 1 or top_k < 1 or (width is not None and width < 1):
        raise ValueError("steps, top_k and width must be >= 1")
    w = top_k if width is None else min(width, top_k)
    dev = root_logp.device
    bsz = root_logp.shape[0]
    n = pool_size(steps, top_k, w)
    tokens = torch.zeros(bsz, n, dtype=torch.long, device=dev)
    parents = torch.full((bsz, n), -1, dtype=torch.long, device=dev)
    depth = torch.zeros(bsz, n, dtype=torch.long, device=dev)
    logp = torch.zeros(bsz, n, dtype=torch.float32, device=dev)
    path = torch.zeros(bsz, n, dtype=torch.float32, device=dev)
    anc = torch.zeros(bsz, n, n, dtype=torch.bool, device=dev)  # strict ancestors
    tokens[:, 0] = root_tokens

    lp, tok = root_logp.float().topk(top_k, dim=-1)  # [B, k]
    idx = torch.arange(1, 1 + top_k, device=dev)
    tokens[:, idx] = to_target(tok)
    parents[:, idx] = 0
    depth[:, idx] = 1
    logp[:, idx] = lp
    path[:, idx] = lp
    anc[:, idx, 0] = True
    frontier = idx[:w].expand(bsz, w).clone()  # pool indices [B, w] (topk is sorted: the best w children)
    nxt = 1 + top_k
    m = w * top_k  # candidates per level
    ar_b = torch.arange(bsz, device=dev)[:, None]
    for d in range(2, steps + 1):
        f_tok = tokens.gather(1, frontier)
        child_lp = expand(f_tok, frontier, anc[ar_b, frontier])  # [B, w, V]
        c_lp, c_tok = child_lp.float().topk(top_k, dim=-1)  # [B, w, k]
        f_path = path.gather(1, frontier)
        cu = (f_path[:, :, None] + c_lp).reshape(bsz, -1)  # [B, w*k]
        new_idx = torch.arange(nxt, nxt + m, device=dev)
        par = frontier[:, :, None].expand(bsz, w, top_k).reshape(bsz, -1)
        tokens[:, new_idx] = to_target(c_tok.reshape(bsz, -1))
        parents[:, new_idx] = par
        depth[:, new_idx] = d
        logp[:, new_idx] = c_lp.reshape(bsz, -1)
        path[:, new_idx] = cu
        par_anc = anc[ar_b, par]  # [B, w*k, n]
        par_anc[ar_b, torch.arange(m, device=dev)[None, :], par] = True
        anc[:, new_idx] = par_anc
        best = cu.topk(w, dim=-1).indices  # [B, w]
        frontier = new_idx[best]
        nxt += m
    anc |= torch.eye(n, dtype=torch.bool, device=dev)  # strict ancestors -> ancestor-or-self, kept by the tree
    return DraftTree(tokens=tokens, parents=parents, depth=depth, logp=logp, path_logp=path,
                     valid=torch.ones(bsz, n, dtype=torch.bool, device=dev), anc=anc)


def proposer_features(parents: torch.Tensor, states: torch.Tensor, root_feature: torch.Tensor) -> torch.Tensor:
    """``[B, N, F]`` :attr:`DraftTree.features` from the drafter's step outputs: each node gets its parent's state.

    Args:
        parents: ``[B, N]`` the tree's parents (``-1`` at the root).
        states: ``[B, N, F]`` output of the draft step that consumed each node (read at expanded nodes only).
        root_feature: ``[B, F]`` output of the step that consumed the committed token before the root.
    """
    out = states.gather(1, parents.clamp(min=0)[..., None].expand(-1, -1, states.shape[-1]))
    out[:, 0] = root_feature.to(out.dtype)
    return out
