# SPDX-License-Identifier: Apache-2.0
"""Calibrated node values (``specmoe.decoding.node_values``) for the tree selectors: the online calibration
learns an under-confident drafter's acceptance from synthetic outcomes, the calibrated selectors then prefer the
deep chain node the raw path probabilities rank below a low-share sibling, and decoding with them stays lossless
on the three tiny architectures (the calibration refitted during the run, so the calibrated ranking is what ran)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures.agreeing import MIN_MULTI, multi_token_share
from fixtures.tiny import random_prompts

from specmoe.decoding.acceptance_model import _PRIOR
from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.node_values import NodeValues, path_values, path_values_host
from specmoe.decoding.stopping import StopRule
from specmoe.decoding.tree_builder import build_pool, pool_size
from specmoe.interfaces.tree import DraftTree, ancestor_matrix
from specmoe.registry import drafters, predictors, selectors

#: an under-confident draft: the token the target will take (id 0) gets 0.33, the runner-up (id 1) 0.15, the rest
#: is spread over the vocabulary; the target takes id 0 with probability 0.85, id 1 with 0.05
VOCAB = 40
TOP1, TOP2 = 0.33, 0.15
P_ACC_TOP1, P_ACC_TOP2 = 0.85, 0.05


def _underconfident_logp(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    rest = torch.rand(*shape, VOCAB - 2, generator=gen) + 0.5
    rest = rest / rest.sum(dim=-1, keepdim=True) * (1 - TOP1 - TOP2)
    top = torch.empty(*shape, 2)
    top[..., 0], top[..., 1] = TOP1, TOP2
    jitter = 1 + 0.2 * (torch.rand(*shape, 1, generator=gen) - 0.5)  # vary q a little between nodes
    return torch.cat([top * jitter, rest], dim=-1).clamp(max=0.9).log()


def _pool(gen: torch.Generator, steps: int = 3, top_k: int = 2) -> DraftTree:
    expand = lambda tok, idx, anc: _underconfident_logp(tuple(tok.shape), gen)  # noqa: E731
    return build_pool(torch.zeros(1, dtype=torch.long), _underconfident_logp((1,), gen), expand, steps, top_k)


def _greedy_outcome(tree: DraftTree, rng: np.random.Generator) -> list[int]:
    """The accepted path (node indices, root first) of a greedy target that takes the draft's top-1 token with
    P_ACC_TOP1, its runner-up with P_ACC_TOP2 (else a token the pool lacks): at most one child of an accepted
    node is accepted."""
    par = tree.parents[0].tolist()
    lp = tree.logp[0].tolist()
    path = [0]
    while True:
        kids = sorted((i for i, p in enumerate(par) if p == path[-1]), key=lambda i: -lp[i])
        if not kids:
            return path
        u = rng.random()
        pick = kids[0] if u < P_ACC_TOP1 else kids[1] if u < P_ACC_TOP1 + P_ACC_TOP2 and len(kids) > 1 else None
        if pick is None:
            return path
        path.append(pick)


def _trained_values(steps: int = 150) -> NodeValues:
    gen, rng = torch.Generator().manual_seed(0), np.random.default_rng(0)
    nv = NodeValues(flush_every=4)
    for _ in range(steps):
        tree = _pool(gen)  # the whole pool verified: order is the identity
        order = torch.arange(tree.num_nodes)[None]
        nv.record(tree, torch.ones_like(tree.valid), order, [_greedy_outcome(tree, rng)], temperature=0.0)
    nv.flush()
    return nv


def test_calibration_learns_an_underconfident_drafter():
    """From synthetic greedy outcomes the edge model moves from c = q (the prior) to the realised rates: the
    top-1 edges (q ~0.33) near 0.85, the runner-up edges (q ~0.15) near 0.05 given their parent accepted."""
    nv = _trained_values()
    w = nv.model.weights_for(0.0)
    assert not np.allclose(w, nv.model.prior), "the model should have been refitted from the recorded outcomes"
    tree = _pool(torch.Generator().manual_seed(7))
    before = path_values(tree, torch.as_tensor(_PRIOR, dtype=torch.float32))[0]
    after = nv.values(tree, 0.0)[0]
    lp, par = tree.logp[0], tree.parents[0]
    top1 = [i for i in range(1, tree.num_nodes)
            if lp[i] == max(lp[j] for j in range(1, tree.num_nodes) if par[j] == par[i])]
    assert torch.allclose(before, tree.path_prob[0], rtol=1e-3), "the prior values are the raw P(path)"
    edge = after / after[par.clamp(min=0)]  # calibrated edge acceptance c = value / parent's value
    for i in range(1, tree.num_nodes):
        if i in top1:
            assert 0.7 < float(edge[i]) < 0.95, (i, float(edge[i]))
        else:
            assert float(edge[i]) < 0.2, (i, float(edge[i]))
    cal = nv.model.calibration(0.0)
    assert cal["n"] > 300 and cal["brier"] < 0.2


@pytest.mark.parametrize("first", [False, True])
def test_host_values_are_the_tensor_values(first, monkeypatch):
    """A small CPU pool's values in plain Python (``path_values_host``, what ``NodeValues.values`` uses there)
    equal the tensor form on random pools (padding, an inactive row, ties, near-certain and clipped edges) and
    random weights, the likeliest-child feature with them or without."""
    from fixtures.random_trees import random_tree

    from specmoe.decoding import node_values

    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        tree = random_tree(4, 13, g)
        tree.logp = (torch.rand(4, 13, generator=g) * 0.98 + 0.01).log()
        w = torch.randn(5 if first else 4, generator=g)
        torch.testing.assert_close(path_values_host(tree, w.tolist()), path_values(tree, w), rtol=2e-5, atol=1e-7)
        # near-certain and clipped edges: logit(q) near q = 1 is ill-conditioned in float32 (the tensor form)
        tree.logp[0, 1:4] = torch.tensor([-1e-9, -30.0, -1e-3])
        torch.testing.assert_close(path_values_host(tree, w.tolist()), path_values(tree, w), rtol=2e-2, atol=1e-6)
    nv = NodeValues()
    calls = []
    monkeypatch.setattr(node_values, "path_values_host", lambda *a: calls.append(1) or path_values_host(*a))
    nv.values(tree, 0.0)
    assert calls, "a small CPU pool takes the host path"
    monkeypatch.setattr(node_values, "SCALAR_POOL", 0)
    nv.values(tree, 0.0)
    assert len(calls) == 1, "a large pool takes the tensor path"


def _chain_vs_sibling_tree() -> DraftTree:
    """root -> a (0.33) -> aa (0.27) -> aaa (0.34); root -> b (0.15): raw P(b) 0.15 > P(aa) 0.089 > P(aaa) 0.030;
    ``aa`` and ``aaa`` have low-probability siblings too (as a top-2 pool has)."""
    #             0   1:a   2:b   3:aa  4:ab  5:aaa 6:aab
    parents = [-1, 0, 0, 1, 1, 3, 3]
    probs = [1.0, 0.33, 0.15, 0.27, 0.12, 0.34, 0.14]
    return DraftTree.from_lists(list(range(7)), parents, probs)


@pytest.mark.parametrize("name", ["confidence", "ecospec", "global_cost"])
def test_calibrated_selectors_prefer_the_deep_chain(name):
    """With the learned values each tree selector verifies the chain a -> aa -> aaa at budget 4; with the raw
    values (``calibrated: false``) the sibling b displaces aaa."""
    nv = _trained_values()
    tree = _chain_vs_sibling_tree()
    n = tree.num_nodes
    experts = torch.zeros(1, n, 2, 4, dtype=torch.bool)
    experts[..., 0] = True  # every node predicts the same experts: the expert cost is equal, the values decide
    raw = selectors.get(name)(calibrated=False).select(tree, 4, experts)
    assert raw[0].nonzero().flatten().tolist() == [0, 1, 2, 3]
    cal_sel = selectors.get(name)()
    assert cal_sel.node_values and not selectors.get(name)(calibrated=False).node_values
    tree.value = nv.values(tree, 0.0)
    assert float(tree.value[0, 5]) > float(tree.value[0, 2]), "calibrated: the depth-3 chain node beats b"
    sel = cal_sel.select(tree, 4, experts)
    assert sel[0].nonzero().flatten().tolist() == [0, 1, 3, 5]
    # the same tree with the values ignored ranks raw again
    assert selectors.get(name)(calibrated=False).select(tree, 4, experts).equal(raw)


def test_subset_carries_values():
    tree = _chain_vs_sibling_tree()
    tree.value = torch.arange(7, dtype=torch.float32)[None]
    sub = tree.subset(torch.tensor([[0, 1, 3, 5]]), torch.ones(1, 4, dtype=torch.bool))
    assert sub.value.tolist() == [[0.0, 1.0, 3.0, 5.0]]


def test_pool_frontier_width():
    """``width`` frontier nodes per level: 1 expands the best path only (top_k children at every depth), top_k is
    EAGLE-2/3's pool exactly; the pool stays parent-before-child with consistent depths and ancestors."""
    gen = torch.Generator().manual_seed(3)
    calls: list[int] = []

    def expand(tok, idx, anc):
        calls.append(tok.shape[1])
        return torch.log_softmax(torch.randn(*tok.shape, VOCAB, generator=gen), dim=-1)

    root = torch.log_softmax(torch.randn(2, VOCAB, generator=gen), dim=-1)
    chain_like = build_pool(torch.zeros(2, dtype=torch.long), root, expand, 4, 2, width=1)
    assert calls == [1, 1, 1] and chain_like.num_nodes == pool_size(4, 2, 1) == 1 + 2 + 3 * 2
    par = chain_like.parents
    assert bool((par[:, 1:] < torch.arange(1, chain_like.num_nodes)).all())
    assert chain_like.depth.tolist()[0] == [0, 1, 1, 2, 2, 3, 3, 4, 4]
    for d in (2, 3, 4):  # each level hangs under the best node of the level above
        upper = (chain_like.depth == d - 1)
        best = torch.where(upper, chain_like.path_logp, torch.full_like(chain_like.path_logp, -1e9)).argmax(dim=1)
        lvl = chain_like.depth == d
        assert bool((par[lvl].view(2, -1) == best[:, None]).all())
    assert chain_like.ancestors().equal(ancestor_matrix(par))  # the builder's own matrix is the parents' one
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    e = lambda g: (lambda tok, idx, anc: torch.log_softmax(torch.randn(*tok.shape, VOCAB, generator=g), -1))  # noqa: E731
    full = build_pool(torch.zeros(2, dtype=torch.long), root, e(g1), 3, 2, width=2)
    default = build_pool(torch.zeros(2, dtype=torch.long), root, e(g2), 3, 2)
    assert full.tokens.equal(default.tokens) and full.parents.equal(default.parents) and full.num_nodes == 11


MAX_NEW = 16


@pytest.mark.parametrize("frontier", [None, 1])
def test_calibrated_greedy_equals_ar(make_predictable, agreeing_drafts, arch, frontier):
    """EAGLE-3 drafts that agree with the target (EAGLE-2/3's pool, and the width-1 pool), every calibrated tree
    selector, γ 2/4/6, batch 1 and 3: output equals AR; the engine's calibration was refitted from the run's
    outcomes (its weights left the prior), so the selections after the first refit ranked by calibrated values;
    multi-token acceptance asserted."""
    target, _ = make_predictable(arch)
    drafter = drafters.get("eagle3")(path=str(agreeing_drafts(arch, "eagle3")), frontier=frontier)
    drafter.setup(target)
    pred = predictors.get("router_on_embedding")()
    pred.setup(target)
    prompts = random_prompts(3, [2, 11, 29], target.vocab_size, seed=5)
    free = ar_generate(target, prompts[:1], temperature=0, stop=StopRule(MAX_NEW))
    stop = StopRule(MAX_NEW, stop_ids=[free.tokens[0][5]])
    refs = [ar_generate(target, [p], temperature=0, stop=stop).tokens[0] for p in prompts]
    for name in ("confidence", "ecospec", "global_cost"):
        engine = SpeculativeEngine(target, drafter, selectors.get(name)(), pred)
        assert engine.values is not None
        gens = []
        for gamma in (2, 4, 6):
            for p, ref in zip(prompts, refs):
                out = engine.generate([p], budget=gamma, steps=3, top_k=2, temperature=0, stop=stop)
                assert out.tokens[0] == ref, f"{arch} {name} gamma={gamma} len {len(p)}"
                gens.append(out)
        out = engine.generate(prompts, budget=4, steps=3, top_k=2, temperature=0, stop=stop)
        assert out.tokens == refs, f"{arch} {name} batch"
        assert engine.values.model.calibration(0.0)["n"] > 0
        model = engine.values.model
        assert not np.allclose(model.weights_for(0.0), model.prior), f"{arch} {name}: never refitted"
        assert multi_token_share(gens + [out]) >= MIN_MULTI
    assert SpeculativeEngine(target, drafter, selectors.get("confidence")(calibrated=False)).values is None
