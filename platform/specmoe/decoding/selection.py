# SPDX-License-Identifier: Apache-2.0
"""Building blocks for selectors: path expert footprints and greedy ancestor-closed selection."""

from __future__ import annotations

from typing import Callable

import torch

from specmoe.interfaces.tree import DraftTree

__all__ = ["path_experts", "greedy_select"]


def path_experts(tree: DraftTree, experts: torch.Tensor) -> torch.Tensor:
    """``experts [B, N, L, E]`` per-node sets -> ``[B, N, L * E]`` bool union over each root-to-node path."""
    b, n = experts.shape[:2]
    flat = experts.reshape(b, n, -1).float()
    return torch.bmm(tree.ancestors().float(), flat) > 0


#: ``score(selected [B, N] bool) -> [B, N]`` float scores of every node given the current selection
ScoreFn = Callable[[torch.Tensor], torch.Tensor]


def greedy_select(tree: DraftTree, budget: int, score: ScoreFn,
                  on_pick: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
                  joint: bool = False) -> torch.Tensor:
    """Select the root, then repeatedly the best-scoring frontier node (unselected, parent selected).

    Restricting candidates to the frontier keeps the set ancestor-closed by construction; for scores that
    never rank a child above its parent this equals picking the best unselected node (up to ties).

    Args:
        tree: candidate pools ``[B, N]``.
        budget: gamma, nodes per row including the root.
        score: see :data:`ScoreFn`.
        on_pick: called with ``(rows [P], nodes [P])`` after each pick (e.g. to update an expert buffer).
        joint: pick one node per iteration across the whole batch (rows compete for a shared state such as
            a shared expert buffer); otherwise every row picks one node per iteration.

    Returns:
        ``[B, N]`` bool selection.
    """
    bsz, n = tree.tokens.shape
    dev = tree.tokens.device
    sel = torch.zeros(bsz, n, dtype=torch.bool, device=dev)
    sel[:, 0] = tree.valid[:, 0]
    rows = torch.arange(bsz, device=dev)
    if on_pick is not None:
        live = rows[sel[:, 0]]
        on_pick(live, torch.zeros_like(live))
    picks_left = torch.full((bsz,), max(budget - 1, 0), device=dev) * sel[:, 0]
    while bool((picks_left > 0).any()):
        parent_sel = sel.gather(1, tree.parents.clamp(min=0)) & (tree.parents >= 0)
        cand = tree.valid & ~sel & parent_sel & (picks_left > 0)[:, None]
        if not bool(cand.any()):
            break
        s = score(sel).masked_fill(~cand, float("-inf"))
        if joint:
            flat = int(s.reshape(-1).argmax())
            r, c = torch.tensor([flat // n], device=dev), torch.tensor([flat % n], device=dev)
        else:
            has = cand.any(dim=1)
            r = rows[has]
            c = s[has].argmax(dim=1)
        sel[r, c] = True
        picks_left[r] -= 1
        if on_pick is not None:
            on_pick(r, c)
    return sel
