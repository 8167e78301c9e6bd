# SPDX-License-Identifier: Apache-2.0
"""Group Tree Optimization (GTO, arXiv 2509.22134) math: tree reward, group advantages, clipped surrogate.

* Branch value of a root-to-leaf branch ``x_1..x_l``: ``L = sum_{j<=l} prod_{k<=j} T(x_k | prefix, x_<k)``
  (the expected number of its tokens accepted under the target; sampling-free).
* Tree reward: ``r = (1/eta) * logsumexp_i(eta * L_i)`` over the branches of the kept tree (eta = 1).
* Debiased reward ``R = r(tree of the current draft) - r(tree of the frozen reference draft)``.
* Advantage within a group of ``m`` adjacent positions: ``A = (R - mean) / (std + delta)``.
* Ratio on the longest accepted branch ``S`` (length ``l``): ``s = exp((log M(S) - log M0(S)) / max(l, 1))``.
* Surrogate ``L_GTO = -mean(min(s A, clip(s, 1 - eps, 1 + eps) A))``.
"""

from __future__ import annotations

import torch

from specmoe.interfaces.tree import DraftTree, close_under_ancestors

__all__ = [
    "choose_groups",
    "clipped_surrogate",
    "group_advantages",
    "longest_accepted",
    "policy_ratio",
    "select_top_nodes",
    "tree_reward",
]


def select_top_nodes(tree: DraftTree, num_nodes: int) -> torch.Tensor:
    """``[B, N]`` bool: the root plus the ``num_nodes`` best non-root nodes by ``path_logp`` (EAGLE-2 rerank),
    closed under ancestors (a no-op except for ties, since a child never outscores its parent)."""
    score = tree.path_logp.masked_fill(~tree.valid, float("-inf")).clone()
    score[:, 0] = float("-inf")
    k = min(num_nodes, tree.num_nodes - 1)
    sel = torch.zeros_like(tree.valid)
    if k > 0:
        sel.scatter_(1, score.topk(k, dim=1).indices, True)
    sel &= tree.valid
    return close_under_ancestors(tree.parents, sel)


def _path_values(tree: DraftTree, node_prob: torch.Tensor) -> torch.Tensor:
    """``[B, N]`` sum over the root-to-node path (root excluded) of the cumulative target probabilities."""
    b, n = node_prob.shape
    cum = torch.ones(b, n, dtype=node_prob.dtype, device=node_prob.device)
    acc = torch.zeros(b, n, dtype=node_prob.dtype, device=node_prob.device)
    ar = torch.arange(b, device=node_prob.device)
    for i in range(1, n):
        par = tree.parents[:, i].clamp(min=0)
        cum[:, i] = cum[ar, par] * node_prob[:, i]
        acc[:, i] = acc[ar, par] + cum[:, i]
    return acc


def tree_reward(tree: DraftTree, selected: torch.Tensor, node_prob: torch.Tensor,
                eta: float = 1.0) -> torch.Tensor:
    """``[B]`` log-sum-exp aggregated branch values of the selected subtree.

    Args:
        tree: the pool; selected: ``[B, N]`` bool ancestor-closed node set (root included).
        node_prob: ``[B, N]`` target probability of each node's token given its prefix (root ignored).
        eta: LSE temperature (``eta -> inf`` gives max, small ``eta`` approaches the sum).
    """
    values = _path_values(tree, node_prob.float())
    par = tree.parents.clamp(min=0)
    child = (selected & (tree.parents >= 0)).long()
    has_child = torch.zeros_like(child).scatter_add_(1, par, child) > 0
    leaves = selected & ~has_child
    masked = (eta * values).masked_fill(~leaves, float("-inf"))
    return torch.logsumexp(masked, dim=1) / eta


def longest_accepted(tree: DraftTree, selected: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """``[B]`` depth of the deepest selected node whose root path matches ``gold`` (greedy acceptance).

    Args:
        gold: ``[B, D]`` the tokens the target would emit after the root (``gold[:, d - 1]`` at depth ``d``);
            pad with ``-1`` where unknown.
    """
    b, n = tree.tokens.shape
    ok = torch.zeros(b, n, dtype=torch.bool, device=tree.tokens.device)
    ok[:, 0] = True
    ar = torch.arange(b, device=ok.device)
    dmax = gold.shape[1]
    for i in range(1, n):
        d = tree.depth[:, i]
        g = gold.gather(1, (d - 1).clamp(0, dmax - 1)[:, None]).squeeze(1)
        match = (d <= dmax) & (tree.tokens[:, i] == g)
        ok[:, i] = ok[ar, tree.parents[:, i].clamp(min=0)] & match & selected[:, i]
    return (tree.depth * ok).max(dim=1).values


def group_advantages(rewards: torch.Tensor, delta: float = 1e-6) -> torch.Tensor:
    """``[G, m]`` debiased rewards -> standardized advantages within each group (population std)."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, unbiased=False, keepdim=True)
    return (rewards - mean) / (std + delta)


def policy_ratio(logp_cur: torch.Tensor, logp_ref: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """Length-normalized likelihood ratio ``exp((log M - log M0) / max(l, 1))`` of the accepted branches."""
    return torch.exp((logp_cur - logp_ref) / length.clamp(min=1).to(logp_cur.dtype))


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, eps: float) -> torch.Tensor:
    """PPO-clip loss ``-mean(min(s A, clip(s, 1 - eps, 1 + eps) A))`` (a scalar to minimize)."""
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps, 1.0 + eps) * adv
    return -torch.minimum(unclipped, clipped).mean()


def choose_groups(candidates: torch.Tensor, group_size: int, num_groups: int,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick up to ``num_groups`` non-overlapping windows of ``group_size`` adjacent candidate positions.

    Each row is cut into consecutive windows from a random offset; windows made only of candidates are
    eligible, and ``num_groups`` of them are drawn at random over the batch.

    Args:
        candidates: ``[B, N]`` bool positions that may be used.

    Returns:
        ``(rows [G, m], positions [G, m])`` int64 (``G`` may be 0).
    """
    b, n = candidates.shape
    m = group_size
    cand = candidates.cpu()
    rows, starts = [], []
    for r in range(b):
        off = int(torch.randint(0, m, (1,), generator=generator)) if m > 1 else 0
        for s in range(off, n - m + 1, m):
            if bool(cand[r, s:s + m].all()):
                rows.append(r)
                starts.append(s)
    if not rows:
        empty = torch.zeros(0, m, dtype=torch.long)
        return empty, empty.clone()
    pick = torch.randperm(len(rows), generator=generator)[:num_groups]
    rr = torch.tensor(rows)[pick]
    ss = torch.tensor(starts)[pick]
    return rr[:, None].expand(-1, m).clone(), ss[:, None] + torch.arange(m)[None]
