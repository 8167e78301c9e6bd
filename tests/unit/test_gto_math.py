# SPDX-License-Identifier: Apache-2.0
"""GTO math on hand-computed examples: tree reward (LSE of branch values), acceptance, advantages, ratio,
PPO-clip surrogate, group choice."""

from __future__ import annotations

import math

import torch

from specmoe.interfaces.tree import DraftTree
from specmoe_plugins.drafters.gto.objective import (
    choose_groups,
    clipped_surrogate,
    group_advantages,
    longest_accepted,
    policy_ratio,
    select_top_nodes,
    tree_reward,
)


def _tree():
    #        0 (root)
    #      /   \
    #     1     2          depth 1
    #    / \     \
    #   3   4     5        depth 2
    return DraftTree.from_lists([7, 1, 2, 3, 4, 5], [-1, 0, 0, 1, 1, 2], probs=[1, .6, .3, .5, .4, .9])


def test_tree_reward_is_lse_of_branch_values():
    t = _tree()
    p = torch.tensor([[1.0, 0.5, 0.2, 0.4, 0.9, 0.5]])  # target prob of each node given its prefix
    sel = torch.ones(1, 6, dtype=torch.bool)
    # branches 0-1-3, 0-1-4, 0-2-5: L = p1 + p1*p3, p1 + p1*p4, p2 + p2*p5
    vals = [0.5 + 0.5 * 0.4, 0.5 + 0.5 * 0.9, 0.2 + 0.2 * 0.5]
    expect = math.log(sum(math.exp(v) for v in vals))
    assert math.isclose(float(tree_reward(t, sel, p)), expect, rel_tol=1e-6)
    # eta -> large approaches the max branch value; a pruned subtree only counts its own leaves
    assert math.isclose(float(tree_reward(t, sel, p, eta=200.0)), max(vals), abs_tol=0.01)
    sel2 = torch.tensor([[True, True, True, False, False, False]])
    assert math.isclose(float(tree_reward(t, sel2, p)), math.log(math.exp(0.5) + math.exp(0.2)), rel_tol=1e-6)
    only_root = torch.tensor([[True] + [False] * 5])
    assert float(tree_reward(t, only_root, p)) == 0.0


def test_select_top_nodes_and_longest_accepted():
    t = _tree()
    # path probabilities: 1: .6, 2: .3, 3: .3, 4: .24, 5: .27 -> best 3 = {1, 2, 3}
    sel = select_top_nodes(t, 3)
    assert sel[0].tolist() == [True, True, True, True, False, False]
    assert longest_accepted(t, sel, torch.tensor([[1, 3]])).item() == 2
    assert longest_accepted(t, sel, torch.tensor([[1, 4]])).item() == 1  # node 4 not selected
    assert longest_accepted(t, torch.ones(1, 6, dtype=torch.bool), torch.tensor([[1, 4]])).item() == 2
    assert longest_accepted(t, sel, torch.tensor([[2, 5]])).item() == 1
    assert longest_accepted(t, sel, torch.tensor([[9, 3]])).item() == 0
    assert longest_accepted(t, sel, torch.tensor([[1, -1]])).item() == 1  # unknown gold


def test_group_advantages_standardize_within_groups():
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0], [5.0, 5.0, 5.0, 5.0]])
    a = group_advantages(r, delta=0.0 + 1e-9)
    std = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + 0 + (6 - 3) ** 2) / 4)  # population std, mean 3
    torch.testing.assert_close(a[0], torch.tensor([-2 / std, -1 / std, 0.0, 3 / std]))
    assert torch.all(a[1] == 0)  # no signal in a group of equal rewards


def test_ratio_and_clipped_surrogate():
    cur, ref = torch.tensor([-1.0, -2.0, 0.0]), torch.tensor([-2.0, -1.0, 0.0])
    s = policy_ratio(cur, ref, torch.tensor([2, 1, 0]))
    torch.testing.assert_close(s, torch.tensor([math.exp(0.5), math.exp(-1.0), 1.0]))
    eps = 0.2
    close = lambda a, b: math.isclose(float(a), b, rel_tol=1e-6)
    # A > 0: gain capped at (1 + eps) A; A < 0: the pessimistic (larger-penalty) term wins
    assert close(clipped_surrogate(torch.tensor([1.5]), torch.tensor([1.0]), eps), -1.2)
    assert close(clipped_surrogate(torch.tensor([0.5]), torch.tensor([1.0]), eps), -0.5)
    assert close(clipped_surrogate(torch.tensor([0.5]), torch.tensor([-1.0]), eps), 0.8)
    assert close(clipped_surrogate(torch.tensor([1.5]), torch.tensor([-1.0]), eps), 1.5)
    both = clipped_surrogate(torch.tensor([1.5, 0.5]), torch.tensor([1.0, -1.0]), eps)
    assert close(both, (-1.2 + 0.8) / 2)
    # gradient flows only through the unclipped side
    r = torch.tensor([1.5, 1.1], requires_grad=True)
    clipped_surrogate(r, torch.tensor([1.0, 1.0]), eps).backward()
    assert r.grad.tolist() == [0.0, -0.5]


def test_choose_groups_are_adjacent_disjoint_candidates():
    cand = torch.zeros(3, 40, dtype=torch.bool)
    cand[0, 5:30] = True
    cand[2, :] = True
    rows, pos = choose_groups(cand, 4, 100, torch.Generator().manual_seed(0))
    assert rows.shape == pos.shape and rows.shape[1] == 4
    assert torch.all(pos[:, 1:] - pos[:, :-1] == 1)
    assert bool(cand[rows, pos].all()) and not bool((rows == 1).any())
    seen = {(int(r), int(p)) for r, p in zip(rows.flatten(), pos.flatten())}
    assert len(seen) == rows.numel()  # non-overlapping
    rows2, _ = choose_groups(cand, 4, 3, torch.Generator().manual_seed(0))
    assert rows2.shape[0] == 3
    empty, _ = choose_groups(torch.zeros(2, 10, dtype=torch.bool), 4, 3)
    assert empty.shape == (0, 4)
