# SPDX-License-Identifier: Apache-2.0
"""The packed selectors pick exactly the nodes of the original torch implementations (frozen in
``fixtures/reference_selection.py``) on many random trees: random parents, edge probabilities drawn from a small
set (ties in P(path) and in scores), few experts (ties in marginal costs) and GPT-OSS-120B-sized sets, padding
nodes and inactive rows, batch 1 and 8, shared and per-row buffers, with and without an initial buffer. ``ecospec``
is checked through both of its loops (numpy over packed words, and plain Python for small pools)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures import reference_selection as ref
from fixtures.random_trees import random_sets, random_tree
from fixtures.selector_loops import force_loop

from specmoe.decoding.bitsets import pack_bytes_torch, pack_sets, path_unions, popcount_rows
from specmoe.interfaces.tree import DraftTree
from specmoe.registry import selectors

ECOSPEC = "specmoe_plugins.selectors.ecospec"

CASES = [
    # (batch, nodes, layers, experts, top_k)
    (1, 11, 2, 8, 2),
    (1, 25, 3, 6, 2),
    (8, 11, 2, 8, 2),
    (8, 30, 1, 9, 3),
    (8, 61, 36, 128, 4),
]


@pytest.fixture(params=["packed", "scalar"])
def ecospec_loop(request, monkeypatch):
    return request.param, force_loop(monkeypatch, ECOSPEC, request.param)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "bs{}_n{}_L{}_E{}".format(*c[:4]))
def test_packed_selectors_equal_reference(case, ecospec_loop):
    loop, scalar_calls = ecospec_loop
    bsz, n, layers, n_exp, k = case
    g = torch.Generator().manual_seed(sum(case))
    checked = 0
    big = layers * n_exp > 1000  # the dense reference is slow there: fewer trials and budgets
    for trial in range(2 if big else 10):
        tree = random_tree(bsz, n, g, padding=trial % 3 != 0)
        ex = random_sets(bsz, n, layers, n_exp, k, g)
        b0 = torch.rand(layers, n_exp, generator=g) < 0.2 if trial % 2 else None
        for budget in (8,) if big else (1, 2, 4, 8, n + 3):
            for shared in (True, False):
                got = selectors.get("ecospec")(shared_buffer=shared).select(tree, budget, ex, b0)
                want = ref.ecospec(tree, budget, ex, b0, shared_buffer=shared)
                assert torch.equal(got, want), (case, trial, budget, shared)
            assert torch.equal(selectors.get("global_cost")().select(tree, budget, ex),
                               ref.global_cost(tree, budget, ex)), (case, trial, budget)
            assert torch.equal(selectors.get("confidence")().select(tree, budget), ref.confidence(tree, budget))
            checked += 1
    assert checked > 0
    # the scalar loop runs exactly where the rows are independent (per-row buffers, or one row)
    assert (len(scalar_calls) > 0) == (loop == "scalar")


def test_ties_are_broken_like_the_reference():
    """Identical rows (every score tied across rows) and identical siblings: lowest index wins everywhere."""
    g = torch.Generator().manual_seed(5)
    one = random_tree(1, 15, g, padding=False)
    tree = DraftTree(*(t.expand(4, *t.shape[1:]).clone() for t in (one.tokens, one.parents, one.depth, one.logp,
                                                                  one.path_logp, one.valid)))
    ex = random_sets(1, 15, 2, 4, 2, g).expand(4, 15, 2, 4).clone()
    for budget in (2, 5, 9):
        got = selectors.get("ecospec")().select(tree, budget, ex)
        assert torch.equal(got, ref.ecospec(tree, budget, ex))
        assert got[0].sum() >= got[-1].sum()  # joint ties go to the first row


def test_bitsets_match_dense_paths():
    g = torch.Generator().manual_seed(1)
    tree = random_tree(3, 20, g)
    ex = random_sets(3, 20, 5, 13, 3, g)  # 65 bits: two words, the second padded
    packed = path_unions(pack_sets(ex), tree.parents.numpy(), tree.depth.numpy(), tree.valid.numpy())
    dense = ref.path_experts(tree, ex)
    assert packed.shape == (3, 20, 2)
    valid = tree.valid.numpy()
    np.testing.assert_array_equal(popcount_rows(packed)[valid], dense.sum(-1).numpy()[valid])
    # depth inconsistent with parents: the per-node fallback gives the same unions
    bad = path_unions(pack_sets(ex), tree.parents.numpy(), np.zeros((3, 20), dtype=np.int64))
    np.testing.assert_array_equal(popcount_rows(bad), dense.sum(-1).numpy())


def test_device_packing_matches_numpy():
    """The packing used off the CPU (run here on CPU tensors) gives numpy's little-endian bytes."""
    g = torch.Generator().manual_seed(2)
    for bits in (7, 64, 65, 4608):
        flat = torch.rand(5, bits, generator=g) < 0.3
        want = np.packbits(flat.numpy(), axis=-1, bitorder="little")
        np.testing.assert_array_equal(pack_bytes_torch(flat).numpy(), want)
