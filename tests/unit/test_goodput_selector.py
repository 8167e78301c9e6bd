# SPDX-License-Identifier: Apache-2.0
"""``goodput``: the packed greedy (and at batch 1 the scalar one) equals a literal re-evaluation of the expected
rate on random trees (batch 1 and 8, initial buffer or not, both stop rules, the token-only ablation); its plan
is priced consistently; costs and acceptance move the choice the way the objective says; observed outcomes refit
both models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures import reference_selection as ref
from fixtures.random_trees import random_sets, random_tree
from fixtures.selector_loops import force_loop

from specmoe.errors import UserError
from specmoe.interfaces.selection import SelectionContext, StepOutcome
from specmoe.interfaces.tree import is_ancestor_closed
from specmoe.registry import selectors
from specmoe_plugins.selectors.goodput.cost_model import CostModel, VerifyShape

COEF = {"fixed": 4e-3, "tokens": 3e-4, "expert_layers": 6e-5, "kv_slots": 1e-6}


def make(**kw):
    """goodput with the greedy choice in every plan (no exploration of an unfitted acceptance model)."""
    kw.setdefault("explore_outcomes", 0)
    return selectors.get("goodput")(coefficients=kw.pop("coefficients", COEF), **kw)


GOODPUT = "specmoe_plugins.selectors.goodput.selector"


@pytest.mark.parametrize("loop", ["packed", "scalar"])
@pytest.mark.parametrize("stop", ["drop", "best_prefix"])
@pytest.mark.parametrize("bsz,n,layers,n_exp,k", [(1, 11, 4, 16, 2), (8, 11, 3, 12, 2), (8, 30, 2, 8, 2)])
def test_packed_goodput_equals_literal_rate_search(stop, bsz, n, layers, n_exp, k, loop, monkeypatch):
    scalar_calls = force_loop(monkeypatch, GOODPUT, loop)
    g = torch.Generator().manual_seed(bsz * n + layers)
    multi = 0
    for trial in range(6):
        tree = random_tree(bsz, n, g, padding=trial % 2 == 1)
        ex = random_sets(bsz, n, layers, n_exp, k, g)
        b0 = torch.rand(layers, n_exp, generator=g) < 0.2 if trial % 3 == 2 else None
        sel = make(stop=stop)
        ctx = SelectionContext(kv_slots=100, t_draft=2e-3, t_pred=5e-4)
        acc = torch.from_numpy(sel.path_acceptance(tree, 0.0))  # what the plan prices (host form at batch 1)
        for budget in (1, 3, 6, n + 2) if bsz == 1 else (1, 3, 6):  # the literal search is slow
            plan = sel.plan(tree, budget, ex, b0, ctx)
            want, want_rate = ref.goodput(tree, budget, ex, COEF, acc, buffer=b0, t_fixed=2.5e-3, kv_slots=100,
                                          stop=stop)
            assert torch.equal(plan.selected, want), (trial, budget)
            assert plan.expected_rate == pytest.approx(want_rate, rel=1e-9)
            assert bool(is_ancestor_closed(tree.parents, plan.selected)[tree.valid[:, 0]].all())
            assert (plan.selected.sum(1) <= budget).all() and not (plan.selected & ~tree.valid).any()
            multi += int((plan.selected.sum(1) > 1).any())
    assert multi > 0, "some plans must verify more than the roots"
    assert (len(scalar_calls) > 0) == (loop == "scalar" and bsz == 1)  # the scalar loop serves batch 1 only


@pytest.mark.parametrize("bsz", [1, 8])
def test_token_only_ablation_equals_literal_search_and_needs_no_experts(bsz):
    g = torch.Generator().manual_seed(3)
    meta = {"layers": 4, "experts": 16, "top_k": 2}
    union = lambda t: 4 * 16 * (1 - (1 - 2 / 16) ** t)  # noqa: E731
    for trial in range(6):
        tree = random_tree(bsz, 11, g, padding=trial % 2 == 1)
        sel = make(expert_cost=False)
        sel.cost.meta.update(meta)
        assert not sel.needs_experts
        acc = torch.from_numpy(sel.path_acceptance(tree, 0.0))
        plan = sel.plan(tree, 5, None, None, SelectionContext(t_draft=1e-3, t_pred=0.0))
        want, want_rate = ref.goodput(tree, 5, None, COEF, acc, t_fixed=1e-3, expected_union=union)
        assert torch.equal(plan.selected, want)
        assert plan.expected_rate == pytest.approx(want_rate, rel=1e-9)


@pytest.mark.parametrize("first", [True, False])
def test_the_plain_python_path_acceptances_are_the_models(first):
    """A small pool's path acceptances in plain Python (what the plan prices at batch 1) are the acceptance
    model's (float64 both; they differ by the rounding of the float32 path log-probabilities' differences)."""
    g = torch.Generator().manual_seed(11)
    sel = make(acceptance_first=first)
    sel.acceptance.weights[0.0] = np.array([1.2, 0.8, -0.1, 0.6, 1.5][:5 if first else 4])
    for trial in range(8):
        tree = random_tree(1, 11 + trial, g, padding=trial % 2 == 1)
        host = sel.path_acceptance(tree, 0.0, small=True)
        model = sel.path_acceptance(tree, 0.0, small=False)
        assert sel.path_acceptance(tree, 0.0).shape == host.shape == (1, 11 + trial)
        v = tree.valid.numpy()
        np.testing.assert_allclose(host[v], model[v], rtol=1e-5)
        assert np.all(host[:, 0] == 1.0)


def test_plan_pricing_and_select_contract():
    g = torch.Generator().manual_seed(0)
    tree = random_tree(4, 20, g)
    ex = random_sets(4, 20, 3, 12, 2, g)
    sel = make()
    plan = sel.plan(tree, 6, ex, None, SelectionContext(t_draft=3e-3, t_pred=1e-3))
    live = tree.valid[:, 0]
    assert torch.equal(sel.select(tree, 6, ex), sel.plan(tree, 6, ex).selected) and sel.last_plan is not None
    assert plan.t_step == pytest.approx(4e-3 + plan.t_verify)
    assert plan.expected_rate == pytest.approx(float(plan.expected_tokens.sum()) / plan.t_step)
    assert (plan.expected_tokens[~live] == 0).all() and (plan.expected_tokens[live] >= 1).all()
    roots_only = sel.plan(tree, 1, ex, None, SelectionContext(t_draft=3e-3, t_pred=1e-3))
    assert plan.expected_rate >= roots_only.expected_rate
    assert roots_only.expected_rate < roots_only.ar_rate == pytest.approx(plan.ar_rate)  # no free lunch
    empty = tree.valid.clone()
    empty[:] = False
    tree.valid = empty
    assert not sel.plan(tree, 6, ex).selected.any()


def test_costs_and_acceptance_steer_the_choice():
    g = torch.Generator().manual_seed(1)
    tree = random_tree(1, 30, g, padding=False)
    ex = random_sets(1, 30, 8, 32, 4, g)
    free = make(coefficients={"fixed": 1e-2}, gamma_max=7).plan(tree, 20, ex)
    assert int(free.selected.sum()) == 7  # verification costs nothing extra: take gamma_max
    dear = make(coefficients={"fixed": 1e-3, "tokens": 1e-3, "expert_layers": 1e-3}).plan(tree, 20, ex)
    assert int(dear.selected.sum()) == 1  # each node costs more than the rate it adds
    cheap_ex = make(coefficients={"fixed": 4e-3, "tokens": 2e-4, "expert_layers": 1e-6}).plan(tree, 8, ex)
    dear_ex = make(coefficients={"fixed": 4e-3, "tokens": 2e-4, "expert_layers": 2e-4}).plan(tree, 8, ex)
    union = lambda p: int(ex[0][p.selected[0]].any(0).sum())  # noqa: E731
    assert union(dear_ex) < union(cheap_ex)


def test_observe_refits_cost_and_acceptance():
    g = torch.Generator().manual_seed(2)
    true = {"fixed": 1e-3, "tokens": 1e-3, "expert_layers": 1e-4, "kv_slots": 2e-6}
    sel = make(cost_window=64)
    sel.cost.refit_every = sel.cost.min_fit = 16
    rng = np.random.default_rng(0)
    for _ in range(48):
        tree = random_tree(2, 11, g, padding=False)
        selected = torch.zeros(2, 11, dtype=torch.bool)
        selected[:, :3] = True
        selected = selected & tree.valid
        accepted = torch.zeros_like(selected)
        accepted[:, 0] = True
        accepted[:, 1] = tree.parents[:, 1] == 0  # node 1 is the root's child: accepted
        tokens, el, kv = int(rng.integers(2, 9)), 4 * int(rng.integers(2, 15)), int(rng.integers(10, 500))
        t = true["fixed"] + true["tokens"] * tokens + true["expert_layers"] * el + true["kv_slots"] * 2 * kv
        sel.observe(StepOutcome(rows=2, tokens=tokens, width=4, kv_slots=kv, experts_per_layer=[el // 4] * 4,
                                t_verify=t * (1 + 0.01 * rng.standard_normal()), t_draft=2e-3, t_pred=1e-4,
                                t_select=5e-5, tree=tree, selected=selected, accepted=accepted))
    for f, c in true.items():
        assert sel.cost.coefficient(f) == pytest.approx(c, rel=0.25), f
    assert sel.cost.predict_part("t_draft", 2) == pytest.approx(2e-3)
    cal = sel.calibration()
    assert cal["acceptance"]["0.0"]["n"] == 48 * 2 * 2
    assert cal["cost"]["median_abs_rel_error"] < 0.05
    frozen = make(online=False)
    frozen.observe(StepOutcome(rows=1, tokens=1, width=1, kv_slots=1, experts_per_layer=[4], t_verify=1.0))
    assert frozen.cost.coefficients() == COEF


def test_cost_model_file_and_bad_options(tmp_path):
    path = CostModel(COEF, meta={"layers": 4}).save(tmp_path / "cost_model.json")
    sel = selectors.get("goodput")(cost_model=str(path), coefficients={"token_kv": 1e-8})
    assert sel.cost.coefficient("expert_layers") == COEF["expert_layers"]
    assert sel.cost.coefficient("token_kv") == 1e-8 and sel.cost.meta["layers"] == 4
    with pytest.raises(UserError, match="stop"):
        selectors.get("goodput")(stop="never")
    with pytest.raises(UserError, match="coefficients"):
        selectors.get("goodput")(coefficients={"flops": 1.0})
    with pytest.raises(UserError, match="does not exist"):
        selectors.get("goodput")(cost_model=str(tmp_path / "none.json"))


def test_explore_verifies_the_likeliest_child_when_drafts_do_not_pay():
    dear = {"coefficients": {"fixed": 1e-6, "tokens": 1.0, "expert_layers": 0.0}}  # a token costs a whole step
    for seed in (1, 2, 3):
        g = torch.Generator().manual_seed(seed)
        tree = random_tree(1, 30, g, padding=False)
        ex = random_sets(1, 30, 8, 32, 4, g)
        plain = make(**dear).plan(tree, 20, ex)
        assert int(plain.selected.sum()) == 1
        explored = make(**dear, explore=True).plan(tree, 20, ex)
        sel = explored.selected[0]
        kids = (tree.parents[0] == 0) & tree.valid[0]
        best = int(torch.where(kids, tree.path_logp[0], torch.tensor(-1e9)).argmax())
        assert sel.nonzero().flatten().tolist() == [0, best]  # the likeliest child (a = P(path) prior)
        assert explored.expected_rate == plain.expected_rate  # the floor decides on the greedy choice
        assert int(make(**dear, explore=True, gamma_max=1).plan(tree, 20, ex).selected.sum()) == 1


def test_a_catch_up_step_is_priced_as_a_speculative_stretch():
    """The first step of a generation (or after AR steps) absorbs many committed tokens: its measured draft
    seconds are a catch-up the next steps do not pay. Without a fit of draft seconds on absorbed tokens the
    plan is provisional; with one, the plan prices the draft at the stretch's width (the accepted paths seen),
    a steady step's too."""
    g = torch.Generator().manual_seed(4)
    tree = random_tree(1, 11, g, padding=False)
    ex = random_sets(1, 11, 4, 16, 2, g)
    sel = make()
    catch_up = SelectionContext(kv_slots=100, t_draft=10e-3, t_pred=0.0, absorbed=80)
    plan = sel.plan(tree, 4, ex, None, catch_up)
    assert plan.provisional
    steady = sel.plan(tree, 4, ex, None, SelectionContext(kv_slots=100, t_draft=10e-3, t_pred=0.0, absorbed=2))
    assert not steady.provisional and steady.t_step == pytest.approx(plan.t_step)
    selected = torch.zeros(1, 11, dtype=torch.bool)
    selected[0, :3] = True
    accepted = torch.zeros_like(selected)
    accepted[0, 0] = True
    for absorbed in (80, 3, 3, 40):  # draft seconds: 2 ms + 0.1 ms per absorbed token
        sel.observe(StepOutcome(rows=1, tokens=3, width=3, kv_slots=100, experts_per_layer=[4] * 4,
                                t_verify=5e-3, t_draft=2e-3 + 1e-4 * absorbed, t_pred=0.0, t_select=1e-4,
                                absorbed=absorbed, tree=tree, selected=selected & tree.valid, accepted=accepted))
    assert sel.steady_absorbed() == 1  # only the root accepted: the next step absorbs one token
    priced = sel.plan(tree, 4, ex, None, catch_up)
    assert not priced.provisional
    # the same choice priced with 2.1 ms of drafting instead of the catch-up's 10 ms
    assert priced.t_step - (priced.t_verify + 1e-4) == pytest.approx(2.1e-3, rel=1e-3)
    assert priced.catch_up == pytest.approx(10e-3 - 2.1e-3, rel=1e-3)  # what the price left out, for the floor
    assert sel.plan(tree, 4, ex, None, SelectionContext(kv_slots=100, t_draft=1e-3, t_pred=0.0,
                                                        absorbed=80)).catch_up == 0.0  # cheaper than the fit
    # a steady step whose draft happened to be slow (the machine): that draft is paid, the plan prices the steps
    # to come by the fit, so one slow moment does not make the AR floor fall back
    slow = sel.plan(tree, 4, ex, None, SelectionContext(kv_slots=100, t_draft=20e-3, t_pred=0.0, absorbed=1))
    assert not slow.provisional and slow.catch_up == 0.0
    assert slow.t_step - (slow.t_verify + 1e-4) == pytest.approx(2.1e-3, rel=1e-3)


def test_a_calibration_keeps_the_price_of_passes_the_window_has_not_seen(tmp_path):
    """Passes cost a concave function of their tokens. A calibration fitted over 1-64 tokens prices a 64-token
    pass well; a window that has seen only 1-8-token passes, fitted on its own, extrapolates that price badly.
    The run is 15 % slower than the calibration measured. Starting from the calibration, goodput's online fit
    takes the level from the window and keeps the calibration's shape where the window has not been (the
    calibration counts as much as a full window); with the weak pull (as without a calibration) the window alone
    decides."""
    slow = 1.15
    def union(tok):
        return 4 * 32 * (1 - (1 - 4 / 32) ** tok)

    def seconds(tok):
        return 2e-3 + 1e-3 * tok ** 0.5 + 5e-5 * union(tok)

    def shape(tok):
        return VerifyShape(tokens=tok, expert_layers=union(tok), rows=1, kv_slots=500)

    calib = CostModel()
    sweep = [t for t in range(1, 65) for _ in range(3)]
    calib.fit([shape(t) for t in sweep], [seconds(t) for t in sweep])
    path = calib.save(tmp_path / "cost_model.json")
    strong = selectors.get("goodput")(cost_model=str(path), cost_prior_weight=256)
    weak = selectors.get("goodput")(cost_model=str(path))
    assert strong.cost.prior_weight == 256 and weak.cost.prior_weight == 1e-3
    rng = np.random.default_rng(0)
    for _ in range(256):
        tok = int(rng.integers(1, 9))
        t = slow * seconds(tok) * (1 + 0.02 * rng.standard_normal())
        for sel in (strong, weak):
            sel.observe(StepOutcome(rows=1, tokens=tok, width=tok, kv_slots=500, t_verify=t,
                                    experts_per_layer=[union(tok) / 4] * 4, speculative=False))
    assert strong.cost.coefficients() != calib.coefficients()  # refitted online
    def err(cm, tok):
        return abs(cm.predict_verify(shape(tok)) / (slow * seconds(tok)) - 1)

    assert err(calib, 64) > 0.1 and max(err(calib, t) for t in range(1, 9)) > 0.1  # the level is off
    assert err(strong.cost, 64) < 0.08 and max(err(strong.cost, t) for t in range(1, 9)) < 0.08
    assert err(weak.cost, 64) > 0.2  # the window alone: right where it has been, wrong at 64 tokens
    assert max(err(weak.cost, t) for t in range(1, 9)) < 0.02


def test_acceptance_model_knows_the_likeliest_child_by_default():
    """goodput's acceptance model has the fifth feature (the edge is its parent's likeliest drafted child) unless
    ``acceptance_first: false``; its weights say so in the calibration report."""
    five, four = make(), make(acceptance_first=False)
    assert five.acceptance.first and not four.acceptance.first
    g = torch.Generator().manual_seed(3)
    tree = random_tree(1, 11, g)
    ctx = SelectionContext(kv_slots=10, t_draft=1e-3, t_pred=0.0)
    for sel in (five, four):
        plan = sel.plan(tree, 4, random_sets(1, 11, 4, 16, 2, g), None, ctx)
        sel.observe(StepOutcome(rows=1, tokens=int(plan.selected.sum()), width=int(plan.selected.sum()),
                                kv_slots=10, temperature=0.0, experts_per_layer=[2] * 4, t_verify=1e-3,
                                t_draft=1e-3, t_pred=0.0, t_select=1e-4, tree=tree, selected=plan.selected,
                                accepted=plan.selected & (tree.depth == 0)))
    assert [len(s.calibration()["acceptance"]["0.0"]["weights"]) for s in (five, four)] == [5, 4]


def test_an_unfitted_acceptance_model_explores_the_likeliest_nodes_until_it_has_outcomes():
    """``explore_outcomes``: while the acceptance model has fewer outcomes than that at the temperature, a plan
    verifies each live row's ``gamma_max`` likeliest nodes (best first by path acceptance, ancestor-closed) and is
    provisional, even where the greedy would verify the root alone (an under-confident draft); with the outcomes
    in, the plan is the greedy's again."""
    dear = {"coefficients": {"fixed": 1e-6, "tokens": 1.0, "expert_layers": 0.0}}  # a token costs a whole step
    for seed in (1, 2, 3):
        g = torch.Generator().manual_seed(seed)
        tree = random_tree(2, 30, g, padding=seed == 3)
        ex = random_sets(2, 30, 8, 32, 4, g)
        sel = selectors.get("goodput")(**dear)
        greedy = make(**dear).plan(tree, 6, ex)
        assert greedy.selected.sum(dim=1).tolist() == [1, 1] and not greedy.provisional
        plan = sel.plan(tree, 6, ex)
        assert plan.provisional
        for r in range(2):
            chosen = plan.selected[r]
            assert int(chosen.sum()) == min(6, int(tree.valid[r].sum()))
            assert bool(is_ancestor_closed(tree.parents[r][None], chosen[None]))
            # best first by path probability (the unfitted model's acceptance): nothing left out beats a node taken
            # whose parent was taken
            frontier = tree.valid[r] & ~chosen & (tree.parents[r] >= 0) & chosen[tree.parents[r].clamp(min=0)]
            taken = chosen.clone()
            taken[0] = False
            assert float(tree.path_logp[r][frontier].max()) <= float(tree.path_logp[r][taken].min()) + 1e-6
        edges = 32
        sel.acceptance.observe(np.full(edges, -1.0), np.ones(edges), np.zeros(edges), temperature=0.0)
        assert sel.acceptance.outcomes(0.0) == edges
        again = sel.plan(tree, 6, ex)
        assert not again.provisional and again.selected.sum(dim=1).tolist() == [1, 1]
        assert int(make(**dear, gamma_max=1, explore_outcomes=32).plan(tree, 6, ex).selected.sum()) == 2


def test_exploring_an_unfitted_acceptance_model_is_bounded_in_steps():
    """With no outcome ever observed (a draft never accepted gives few), exploration stops after
    ``ceil(explore_outcomes / (gamma_max - 1))`` plans per temperature; another temperature explores on its own."""
    dear = {"coefficients": {"fixed": 1e-6, "tokens": 1.0, "expert_layers": 0.0}}
    g = torch.Generator().manual_seed(5)
    tree = random_tree(1, 30, g, padding=False)
    ex = random_sets(1, 30, 8, 32, 4, g)
    sel = selectors.get("goodput")(**dear, explore_outcomes=10, gamma_max=5)  # ceil(10 / 4) = 3 plans
    explored = [sel.plan(tree, 6, ex).provisional for _ in range(5)]
    assert explored == [True, True, True, False, False]
    hot = SelectionContext(temperature=1.0)
    assert sel.plan(tree, 6, ex, context=hot).provisional and int(sel.plan(tree, 6, ex).selected.sum()) == 1
