# SPDX-License-Identifier: Apache-2.0
"""Selectors: the paper's Figure 3 example, ancestor closure and budgets, the shared batch buffer."""

from __future__ import annotations

import pytest
import torch

from specmoe.decoding.selection import greedy_select, path_experts, top_closed
from specmoe.interfaces.tree import DraftTree, ancestor_matrix, close_under_ancestors, is_ancestor_closed
from specmoe.registry import selectors


def sets(rows: list[set[int]], num_experts: int = 9) -> torch.Tensor:
    """Per-node expert sets of one layer -> ``[1, N, 1, E]``."""
    out = torch.zeros(1, len(rows), 1, num_experts, dtype=torch.bool)
    for i, r in enumerate(rows):
        out[0, i, 0, list(r)] = True
    return out


def figure3():
    # t0 root (P = 1) with experts E1..E4; t1 (P = 0.53) adds E6, E7, E8; t2 (P = 0.4) adds E5, E6
    tree = DraftTree.from_lists([10, 11, 12], [-1, 0, 0], [1.0, 0.53, 0.4])
    experts = sets([{1, 2, 3, 4}, {3, 6, 7, 8}, {2, 4, 5, 6}])
    return tree, experts


def test_figure3_ecospec_picks_t2():
    tree, experts = figure3()
    paths = path_experts(tree, experts)[0]
    assert paths.sum(-1).tolist() == [4, 7, 6]  # |E_traj|: 4, 7, 6 as in the figure
    sel = selectors.get("ecospec")(eps=1e-6).select(tree, 2, experts)
    assert sel[0].tolist() == [True, False, True]


def test_figure3_baselines_pick_t1():
    tree, experts = figure3()
    assert selectors.get("confidence")().select(tree, 2)[0].tolist() == [True, True, False]
    # global cost: 0.53 / 7 = 0.0757 > 0.4 / 6 = 0.0667
    assert selectors.get("global_cost")().select(tree, 2, experts)[0].tolist() == [True, True, False]


def test_initial_buffer_changes_the_choice():
    tree, experts = figure3()
    b0 = torch.zeros(1, 9, dtype=torch.bool)
    b0[0, [6, 7, 8]] = True  # t1's new experts already loaded: t1 becomes free
    sel = selectors.get("ecospec")().select(tree, 2, experts, buffer=b0)
    assert sel[0].tolist() == [True, True, False]


def random_pool(bsz: int, seed: int, layers: int = 3, num_experts: int = 8, k: int = 2):
    from specmoe.decoding.tree_builder import build_pool

    g = torch.Generator().manual_seed(seed)
    vocab = 50

    def expand(tokens, pool_idx, anc):
        return torch.log_softmax(torch.randn(*tokens.shape, vocab, generator=g) * 2, -1)

    tree = build_pool(torch.zeros(bsz, dtype=torch.long), torch.log_softmax(torch.randn(bsz, vocab, generator=g), -1),
                      expand, steps=3, top_k=2)
    idx = torch.stack([torch.randperm(num_experts, generator=g)[:k] for _ in range(bsz * tree.num_nodes * layers)])
    experts = torch.zeros(bsz * tree.num_nodes * layers, num_experts, dtype=torch.bool)
    experts.scatter_(1, idx, True)
    return tree, experts.view(bsz, tree.num_nodes, layers, num_experts)


@pytest.mark.parametrize("name", ["confidence", "ecospec", "global_cost"])
@pytest.mark.parametrize("budget", [1, 2, 4, 6, 11, 20])
def test_selection_is_closed_and_within_budget(name, budget):
    tree, experts = random_pool(3, seed=budget)
    assert tree.num_nodes == 11  # 3 steps x top-2: 10 candidates + root
    sel = selectors.get(name)().select(tree, budget, experts)
    assert bool(is_ancestor_closed(tree.parents, sel).all())
    assert sel[:, 0].all()
    assert (sel.sum(1) == min(budget, tree.num_nodes)).all()


@pytest.mark.parametrize("name", ["confidence", "ecospec", "global_cost"])
@pytest.mark.parametrize("budget", [11, 12])
def test_a_pool_within_the_budget_is_selected_whole_as_the_greedy_selects_it(name, budget, monkeypatch):
    """A pool of at most ``budget`` nodes (a chain of ``budget - 1`` drafts) is selected whole without the greedy
    (``whole_pool``): the greedy's own selection, padding left out."""
    from specmoe.decoding import selection

    tree, experts = random_pool(3, seed=5)
    tree.valid[1, 7:] = False  # row 1's last level is padding (ancestor-closed: leaves only)
    tree.valid[1, 4] = tree.valid[1, 3] = tree.valid[1, 7]
    assert bool(is_ancestor_closed(tree.parents, tree.valid).all())
    module = __import__(selectors.get(name).__module__, fromlist=["whole_pool"])
    fast = selectors.get(name)().select(tree, budget, experts)
    calls = []
    monkeypatch.setattr(module, "whole_pool", lambda *a: calls.append(1) and None)
    greedy = selectors.get(name)().select(tree, budget, experts)
    assert calls and torch.equal(fast, greedy) and torch.equal(fast, tree.valid)
    assert selection.whole_pool(tree, tree.num_nodes - 1) is None


def test_confidence_is_top_by_path_probability():
    tree, _ = random_pool(2, seed=7)
    sel = selectors.get("confidence")().select(tree, 5)
    for b in range(2):
        order = tree.path_logp[b, 1:].argsort(descending=True)[:4] + 1
        assert set(order.tolist()) == set(sel[b].nonzero().squeeze(1).tolist()) - {0}


@pytest.mark.parametrize("host", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_the_top_set_without_a_loop_is_the_greedy_frontier_selection(seed, host, monkeypatch):
    """``top_closed`` (confidence's selection: one sort, no loop over picks; in plain Python for a small CPU pool,
    else in tensor operations) selects what the greedy frontier loop selects
    with the same ranking (path value, then shallower, then lower index) on random pools with padding, an
    inactive row, out-of-depth-order indices and tied values (edge probabilities of 1); a child whose key exceeds
    its parent's by rounding still gets a closed set."""
    from fixtures.random_trees import random_tree

    from specmoe.decoding import selection

    calls = []
    monkeypatch.setattr(selection, "SCALAR_POOL", 10**6 if host else 0)
    real = selection._top_closed_host
    monkeypatch.setattr(selection, "_top_closed_host", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(seed)
    tree = random_tree(4, 14, g)
    n = tree.num_nodes
    key = tree.path_logp.double() - tree.depth.double() * 1e-9 - torch.arange(n).double() * 1e-12
    for budget in (1, 2, 3, 5, 9, 14, 20):
        greedy = greedy_select(tree, budget, lambda sel: key)
        assert torch.equal(top_closed(tree, tree.path_logp, budget), greedy), budget
    bumped = tree.path_logp.clone()
    child = int((tree.parents[0] > 0).nonzero()[0])
    bumped[0, child] = bumped[0, tree.parents[0, child]] + 1e-6
    for budget in (2, 3, 5, 9):
        sel = top_closed(tree, bumped, budget)
        assert bool(is_ancestor_closed(tree.parents, sel)[[0, 2, 3]].all())
        assert (sel.sum(1)[[0, 2, 3]] == torch.minimum(tree.valid.sum(1)[[0, 2, 3]], torch.tensor(budget))).all()
    assert not top_closed(tree, tree.path_logp, 5)[1].any()  # the inactive row
    assert bool(calls) == host


def test_ecospec_never_has_a_larger_predicted_union_than_confidence_on_average():
    """Cost-aware selection reduces the predicted expert union (the point of EcoSpec)."""
    tot_eco, tot_conf = 0, 0
    for seed in range(30):
        tree, experts = random_pool(1, seed)
        for name in ("ecospec", "confidence"):
            sel = selectors.get(name)().select(tree, 4, experts)
            union = (experts[0][sel[0]]).any(0).sum().item()
            if name == "ecospec":
                tot_eco += union
            else:
                tot_conf += union
    assert tot_eco < tot_conf


def test_shared_buffer_across_batch():
    """With a shared buffer, two identical rows pick identical nodes; the union over the batch is no larger
    than with one buffer per row."""
    tree, experts = random_pool(1, seed=3)
    tree2 = DraftTree(*(t.expand(2, *t.shape[1:]).clone() for t in (tree.tokens, tree.parents, tree.depth,
                                                                     tree.logp, tree.path_logp, tree.valid)))
    ex2 = experts.expand(2, *experts.shape[1:])
    shared = selectors.get("ecospec")(shared_buffer=True).select(tree2, 4, ex2)
    sep = selectors.get("ecospec")(shared_buffer=False).select(tree2, 4, ex2)
    assert (shared[0] == shared[1]).all() and (sep[0] == sep[1]).all()
    assert (shared.sum(1) == 4).all()


def test_tree_helpers():
    tree = DraftTree.from_lists([5, 6, 7, 8, 9], [-1, 0, 0, 1, 3], [1, .5, .4, .3, .2])
    anc = ancestor_matrix(tree.parents)[0]
    assert anc[4].nonzero().squeeze(1).tolist() == [0, 1, 3, 4]
    assert tree.depth[0].tolist() == [0, 1, 1, 2, 3]
    assert tree.paths(0) == [[0, 2], [0, 1, 3, 4]]
    assert torch.allclose(tree.path_prob[0], torch.tensor([1, .5, .4, .15, .03]))
    sel = torch.tensor([[False, False, False, False, True]])
    assert close_under_ancestors(tree.parents, sel)[0].tolist() == [True, True, False, True, True]
    assert not bool(is_ancestor_closed(tree.parents, sel)[0])
    sub = tree.subset(torch.tensor([[0, 1, 3]]), torch.ones(1, 3, dtype=torch.bool))
    assert sub.parents[0].tolist() == [-1, 0, 1] and sub.tokens[0].tolist() == [5, 6, 8]
    with pytest.raises(ValueError):
        DraftTree.from_lists([1, 2], [-1, 1])
