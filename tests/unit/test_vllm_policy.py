# SPDX-License-Identifier: Apache-2.0
"""The vLLM plugin's policy (``plugins/specmoe_vllm/specmoe_vllm/policy.py``), pure Python, without vLLM.

The plugin is its own distribution (installed into vLLM's environment); here its directory goes on ``sys.path``
and only the policy module is imported (the scheduler needs vLLM: ``tests/vllm/test_plugin.py``).
"""

from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "specmoe_vllm"))
from specmoe_vllm import policy as P  # noqa: E402

L, E, K = 2, 8, 2


def _table(**over):
    # tokens 10..13 use experts {0, 1} at both layers (shared), tokens 20..23 each their own pair
    ids = [10, 11, 12, 13, 20, 21, 22, 23]
    rows = [[[0, 1], [0, 1]]] * 4 + [[[2 + i % 3 * 2, 3 + i % 3 * 2]] * L for i in range(4)]
    d = {"num_layers": L, "num_experts": E, "top_k": K, "fallback": [[6, 7], [6, 7]], "token_ids": ids,
         "table": rows, "token_counts": [1] * len(ids)}
    d.update(over)
    return d


def _policy_dict(cost=None, prior=(0.9, 0.8, 0.7), experts=True, accuracy=None, **over):
    d = {"format": P.FORMAT, "max_drafts": 3, "tolerance": 0.01,
         "cost": cost or {"fixed": 1e-3, "tokens": 1e-4, "expert_layers": 0.0, "kv_slots": 0.0, "draft_steps": 0.0},
         "acceptance": {"prior": {"greedy": list(prior)}, "strength": 20, "request_strength": 8}}
    if experts:
        d["experts"] = _table() if accuracy is None else _table(accuracy=accuracy)
    d.update(over)
    return d


def _spec(tmp_path, **kw):
    p = tmp_path / "policy.json"
    p.write_text(json.dumps(_policy_dict(**kw)))
    return P.load_policy(p)


# ------------------------------------------------------------------------------------------ the file
@pytest.mark.parametrize("edit, key", [
    (lambda d: d.update(format="other/1"), "'format'"),
    (lambda d: d.pop("cost"), "'cost'"),
    (lambda d: d["cost"].update(bogus=1.0), "'cost.bogus'"),
    (lambda d: d["cost"].update(tokens=-1.0), "'tokens'"),
    (lambda d: d["acceptance"]["prior"].update(greedy=[1.5]), "'acceptance.prior.greedy'"),
    (lambda d: d["experts"]["table"].__setitem__(0, [[0, 99], [0, 1]]), "'experts.table[0]'"),
    (lambda d: d["experts"].pop("fallback"), "'experts.fallback'"),
    (lambda d: d["experts"].update(accuracy=1.5), "'accuracy'"),
    (lambda d: (d.pop("experts"), d["cost"].update(expert_layers=1e-5)), "'experts'"),
    (lambda d: d.update(cost_tokens={"fixed": 1e-3, "bogus": 1.0}), "'cost_tokens.bogus'"),
    (lambda d: d.update(cost_tokens={"fixed": 1e-3, "expert_layers": 1e-5}), "'cost_tokens.expert_layers'"),
])
def test_bad_policy_file_names_the_file_and_key(tmp_path, edit, key):
    d = _policy_dict()
    edit(d)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    with pytest.raises(P.PolicyFileError) as exc:
        P.load_policy(p)
    msg = str(exc.value)
    assert str(p) in msg and key in msg and "export-policy" in msg


def test_missing_or_unreadable_policy_file(tmp_path):
    with pytest.raises(P.PolicyFileError, match="does not exist"):
        P.load_policy(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(P.PolicyFileError, match="not readable JSON"):
        P.load_policy(tmp_path / "x.json")


def test_table_frequencies_sum_to_top_k(tmp_path):
    spec = _spec(tmp_path)
    for f in spec.table.frequency:
        assert sum(f) == pytest.approx(K)
    assert spec.table.of(10) == [[0, 1], [0, 1]] and spec.table.of(999) == [[6, 7], [6, 7]]


# ------------------------------------------------------------------------------------------ acceptance
def test_acceptance_counts_what_a_step_shows():
    a = P.Acceptance({"greedy": [0.5]}, strength=2.0, request_strength=0.0, positions=3)
    a.observe("greedy", "r", drafted=3, accepted=1)  # position 0 accepted, 1 rejected, 2 not seen
    assert a.rate("greedy", 0) == pytest.approx(2 / 3)
    assert a.rate("greedy", 1) == pytest.approx(1 / 3)
    assert a.rate("greedy", 2) == pytest.approx(0.5)
    # the request accepted 1 where the pooled rates expected 0.5 + 0.5: its factor is 1 / 1 with no shrinkage
    assert a.factor("r") == pytest.approx(1.0)
    chain = a.chain("greedy", "r", 3)
    assert chain == pytest.approx([2 / 3, 2 / 9, 1 / 9])
    a.forget("r")
    assert a.factor("r") == 1.0


def test_a_request_that_keeps_rejecting_stops_speculating(tmp_path):
    pol = P.GoodputPolicy(_spec(tmp_path), 3, online=False)
    rows = [P.Row("good", [20, 21, 22], 10), P.Row("bad", [20, 21, 22], 11)]
    assert pol.decide(rows).k == {"good": 3, "bad": 3}
    for _ in range(40):
        pol.observe_step([("good", False, 3, 3), ("bad", False, 3, 0)])
    k = pol.decide(rows).k
    assert k["good"] == 3 and k["bad"] == 0


def _floor_then(pol, rows, steps, accepted):
    """Run ``steps`` decisions; a step that verifies drafts sees ``accepted(req, k)`` of them accepted. Returns the
    steps whose proposal was non-zero and the steps that verified drafts."""
    proposed, verified = [], []
    for s in range(steps):
        d = pol.decide(rows)
        if d.k_next:
            proposed.append(s)
        if any(d.k.values()):
            verified.append(s)
            pol.observe_step([(r.req, False, d.k[r.req], accepted(r.req, d.k[r.req])) for r in rows if d.k[r.req]])
    return proposed, verified


def test_a_request_on_the_floor_probes_and_speculates_again(tmp_path):
    """One rejected step put a request on the floor (its factor fell); nothing drafted, nothing learned. The
    policy probes after PROBE_FIRST floor steps, verifies the probe's drafts, and speculates again once they
    are accepted (vLLM on a Sapphire Rapids: two of 16 prompts stayed on the floor for all 96 tokens)."""
    cost = {"fixed": 2.9e-3, "tokens": 2.9e-3, "expert_layers": 0.0, "kv_slots": 0.0, "draft_steps": 0.0,
            "spec_pass": 2.3e-3}
    pol = P.GoodputPolicy(_spec(tmp_path, cost=cost, prior=(0.89, 0.93, 0.9)), 3, online=False, plain_steps=True)
    rows = [P.Row("a", [20, 21, 22], 10)]
    assert pol.decide(rows).k == {"a": 3}
    pol.observe_step([("a", False, 3, 0)])
    plain = [P.Row("a", [], 10)]
    assert pol.decide(plain).k_next == 0  # on the floor
    proposed, _ = _floor_then(pol, plain, P.PROBE_FIRST - 1, lambda r, k: k)
    assert proposed == [P.PROBE_FIRST - 2]  # the PROBE_FIRST-th floor step proposes
    d = pol.decide(rows)  # the probe's drafts: all verified
    assert d.k == {"a": 3}
    pol.observe_step([("a", False, 3, 3)])
    assert pol.decide(rows).k == {"a": 3} and pol.wait == P.PROBE_FIRST


def _never_accepted(tmp_path, steps, on_floor=None, unpriced=None):
    """A request whose drafts are never accepted, decided ``steps`` times (a probe's drafts verified the step
    after it; ``on_floor(policy, step)`` after each floor step; with a list ``unpriced``, the steps the policy lets
    go unpriced are appended to it and not decided): the steps that probed."""
    cost = {"fixed": 2.9e-3, "tokens": 2.9e-3, "expert_layers": 0.0, "kv_slots": 0.0, "draft_steps": 0.0,
            "spec_pass": 2.3e-3}
    pol = P.GoodputPolicy(_spec(tmp_path, cost=cost, prior=(0.05, 0.05, 0.05)), 3, online=False, plain_steps=True)
    plain, drafted = [P.Row("a", [], 10)], [P.Row("a", [20, 21, 22], 10)]
    probes = []
    for s in range(steps):
        verify = bool(probes) and probes[-1] == s - 1
        if unpriced is not None and not verify and pol.floor_step_unpriced():
            unpriced.append(s)
            continue
        d = pol.decide(drafted if verify else plain)
        if any(d.k.values()):
            pol.observe_step([("a", False, d.k["a"], 0)])
        if d.k_next:
            probes.append(s)
        elif not any(d.k.values()) and on_floor is not None:
            on_floor(pol, s)
    return probes


def test_probes_back_off_where_the_floor_is_right(tmp_path):
    """Drafts that are never accepted: the waits between probes double up to PROBE_MAX, so probing costs at most
    one step in PROBE_MAX there; with PROBE_MAX steps or more between probes."""
    probes = _never_accepted(tmp_path, 3000)
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[:3] == [2 * P.PROBE_FIRST + 1, 4 * P.PROBE_FIRST + 1, 8 * P.PROBE_FIRST + 1]
    assert gaps[-1] == P.PROBE_MAX + 1 and len(probes) < 3000 / P.PROBE_MAX + 8


def test_floor_steps_hold_rows_only_for_requests_that_reach_the_next_probe(tmp_path):
    """A floor step's rows are kept for the drafter only where some request of the step may still be decoding at
    the next probe (the step that reads them): never once the back-off outlasts every request's remaining tokens,
    always while a request's remaining tokens reach the probe, and on the step before the probe."""
    to_probe = {}

    def floor_step(pol, s):  # which requests' rows are kept, by the tokens they have left
        to_probe[s] = [n for n in (1, 8, 100, 300) if pol.holds([n])]
        assert pol.holds([1, 300]) == (300 in to_probe[s]) and not pol.holds([])

    probes = _never_accepted(tmp_path, 2000, floor_step)
    a, b = probes[-2], probes[-1]  # the last full back-off: PROBE_MAX floor steps between the probe's steps
    assert b - a == P.PROBE_MAX + 1
    for s in range(a + 2, b):
        assert to_probe[s] == [n for n in (1, 8, 100, 300) if n >= b - s], (s, to_probe[s])
    assert to_probe[b - 1] == [1, 8, 100, 300] and to_probe[a + 2] == [300]


def test_unpriced_floor_steps_keep_the_probes_where_they_were(tmp_path):
    """The scheduler may leave a floor step between probes unpriced (``floor_step_unpriced``): counted as
    :meth:`decide`'s fast path counts it, so the probes come at the same steps; it refuses (counting nothing)
    where a probe is due or pending, and the step then goes through ``decide``."""
    unpriced = []
    assert _never_accepted(tmp_path, 1500, unpriced=unpriced) == _never_accepted(tmp_path, 1500)
    assert len(unpriced) > 1500 * 0.8


def test_floor_steps_between_probes_skip_the_plan(tmp_path, monkeypatch):
    """Between probes a floor step is priced (its shape feeds the cost refit) but not planned: the plan runs on
    the first floor step and at the probe only, and the probes come when they did with a plan every step."""
    cost = {"fixed": 2.9e-3, "tokens": 2.9e-3, "expert_layers": 0.0, "kv_slots": 0.0, "draft_steps": 0.0,
            "spec_pass": 2.3e-3}
    pol = P.GoodputPolicy(_spec(tmp_path, cost=cost, prior=(0.05, 0.05, 0.05)), 3, online=False, plain_steps=True)
    plans = []
    real = pol._plan
    monkeypatch.setattr(pol, "_plan", lambda rows, least=0: plans.append(least) or real(rows, least))
    plain = [P.Row("a", [], 10, context=100)]
    shapes = [pol.decide(plain) for _ in range(P.PROBE_FIRST)]
    assert [d.k_next > 0 for d in shapes] == [False] * (P.PROBE_FIRST - 1) + [True]
    assert plans == [0, 0, 1]  # the first floor step; the probe step's plan, then its forced one
    assert all(d.shape["tokens"] == 1 and d.shape["kv_slots"] == 100 and d.rate > 0 for d in shapes)


# ------------------------------------------------------------------------------------------ decisions
def test_choices_never_exceed_the_proposed_drafts(tmp_path):
    pol = P.GoodputPolicy(_spec(tmp_path), 3, online=False)
    rows = [P.Row("a", [20], 10), P.Row("b", [], 11), P.Row("c", [20, 21, 22, 23], 12)]
    d = pol.decide(rows)
    assert d.k["a"] <= 1 and d.k["b"] == 0 and d.k["c"] <= 3
    assert 0 <= d.k_next <= 3


def test_ar_floor_when_verification_is_expensive(tmp_path):
    """A token costs far more than the fixed part of a pass: no drafts now, none proposed next."""
    cost = {"fixed": 1e-4, "tokens": 1e-2, "expert_layers": 0.0, "kv_slots": 0.0, "draft_steps": 1e-3}
    pol = P.GoodputPolicy(_spec(tmp_path, cost=cost), 3, online=False)
    d = pol.decide([P.Row("a", [20, 21, 22], 10), P.Row("b", [20, 21, 22], 11)])
    assert d.k == {"a": 0, "b": 0} and d.k_next == 0
    assert d.rate == d.ar_rate > 0


def test_cheap_verification_verifies_every_draft(tmp_path):
    pol = P.GoodputPolicy(_spec(tmp_path), 3, online=False)
    d = pol.decide([P.Row("a", [20, 21, 22], 10)])
    assert d.k == {"a": 3} and d.k_next == 3 and d.rate > d.ar_rate


def test_sampled_tokens_are_priced_apart(tmp_path):
    """With the same acceptance, a request sampled at T > 0 pays ``sampled_tokens`` per verified token: a greedy
    request beside it verifies its drafts, the sampled one does not; the step's shape counts the sampled tokens
    (roots included) for the online refit. Without the term both are alike."""
    cost = {"fixed": 1e-3, "tokens": 1e-4, "sampled_tokens": 2e-3}
    pol = P.GoodputPolicy(_spec(tmp_path, cost=cost), 3, online=False)
    d = pol.decide([P.Row("g", [20, 21, 22], 10), P.Row("s", [20, 21, 22], 11, sampled=True)])
    assert d.k == {"g": 3, "s": 0}
    assert d.shape["sampled_tokens"] == 1.0 and d.shape["tokens"] == 5.0
    pol = P.GoodputPolicy(_spec(tmp_path, cost={**cost, "sampled_tokens": 0.0}), 3, online=False)
    d = pol.decide([P.Row("g", [20, 21, 22], 10), P.Row("s", [20, 21, 22], 11, sampled=True)])
    assert d.k == {"g": 3, "s": 3} and d.shape["sampled_tokens"] == 4.0


def test_bigger_batches_verify_fewer_drafts_per_request(tmp_path):
    cost = {"fixed": 2e-3, "tokens": 4e-4, "expert_layers": 0.0, "kv_slots": 0.0, "draft_steps": 0.0}
    pol = P.GoodputPolicy(_spec(tmp_path, cost=cost), 3, online=False)
    per_row = []
    for b in (1, 4, 16):
        d = pol.decide([P.Row(f"r{i}", [20, 21, 22], 10) for i in range(b)])
        per_row.append(sum(d.k.values()) / b)
    assert per_row[0] == 3 and per_row[0] >= per_row[1] >= per_row[2] and per_row[2] < 3


def test_expert_term_prefers_drafts_that_share_experts(tmp_path):
    """Two requests, equal acceptance; one's drafts touch the experts its root already reads, the other's new
    ones. Priced by experts, only the sharing request speculates; the token-only variant treats both alike."""
    cost = {"fixed": 1e-3, "tokens": 1e-5, "expert_layers": 2.5e-4, "kv_slots": 0.0, "draft_steps": 0.0}
    spec = _spec(tmp_path, cost=cost, prior=(0.5, 0.5, 0.5))
    rows = [P.Row("share", [11, 12, 13], 10), P.Row("new", [20, 21, 22], 10)]
    d = P.GoodputPolicy(spec, 3, online=False).decide(rows)
    assert d.k["share"] == 3 and d.k["new"] == 0
    t = P.GoodputPolicy(spec, 3, expert_cost=False, online=False).decide(rows)
    assert t.k["share"] == t.k["new"] == 3


def test_the_table_accuracy_discounts_listed_experts(tmp_path):
    """With the table's accuracy ``a`` the pass's expected union is ``a x`` the listed union ``+ (1 - a) x`` the
    expected union of as many random tokens: at ``a = 0`` the two requests of the test above are priced alike
    (their listed experts do not matter), at ``a = 1`` (a file without ``accuracy``) the listed experts decide."""
    assert _spec(tmp_path).table.accuracy == 1.0
    cost = {"fixed": 1e-3, "tokens": 1e-5, "expert_layers": 2.5e-4, "kv_slots": 0.0, "draft_steps": 0.0}
    rows = [P.Row("share", [11, 12, 13], 10), P.Row("new", [20, 21, 22], 10)]
    for a in (0.0, 0.4):
        spec = _spec(tmp_path, cost=cost, prior=(0.5, 0.5, 0.5), accuracy=a)
        union = P._Union(spec.table)
        for t in (10, 20, 21, 11):
            union.add(t)
        listed = {(layer, e) for t in (10, 20, 21, 11) for layer, es in enumerate(spec.table.of(t)) for e in es}
        assert union.size() == pytest.approx(a * len(listed) + (1 - a) * spec.table.unknown_union(4), rel=1e-12)
        assert union.more(2) == pytest.approx((1 - a) * (spec.table.unknown_union(6) - spec.table.unknown_union(4)))
        d = P.GoodputPolicy(spec, 3, online=False).decide(rows)
        if a == 0.0:  # both verify their drafts (the path that prices them ran), and alike
            assert d.k["share"] == d.k["new"] == 3
        else:  # the listed experts still count, at 0.4 of their weight: the sharing request verifies more
            assert d.k["share"] > d.k["new"]


def _rate(pol, rows, k):
    """The policy's objective for an explicit choice (the exhaustive reference)."""
    union = P._Union(pol.spec.table if pol.expert_cost else None)
    num, tokens = 0.0, 0
    for r in rows:
        union.add(r.root)
        num += 1 + sum(pol.acceptance.chain("greedy", r.req, k[r.req]))
        tokens += 1 + k[r.req]
        for t in r.drafts[:k[r.req]]:
            union.add(t)
    return num / pol._seconds(len(rows), tokens, union.size(), 0, pol.K)


@pytest.mark.parametrize("accuracy", [None, 0.6])
def test_greedy_choice_is_close_to_the_exhaustive_optimum(tmp_path, accuracy):
    rnd = random.Random(7)
    cost = {"fixed": 1e-3, "tokens": 2e-4, "expert_layers": 6e-5, "kv_slots": 0.0, "draft_steps": 0.0}
    spec = _spec(tmp_path, cost=cost, prior=(0.9, 0.6, 0.4), tolerance=0.0, accuracy=accuracy)
    worst = 1.0
    for _ in range(20):
        pol = P.GoodputPolicy(spec, 3, online=False)
        rows = [P.Row(f"r{i}", [rnd.choice([10, 11, 20, 21, 22, 23, 5]) for _ in range(3)], rnd.choice([10, 20]))
                for i in range(3)]
        for r in rows:
            for _ in range(rnd.randrange(0, 10)):
                pol.observe_step([(r.req, False, 3, rnd.randrange(0, 4))])
        d = pol.decide(rows)
        best = max(_rate(pol, rows, dict(zip([r.req for r in rows], ks)))
                   for ks in itertools.product(range(4), repeat=len(rows)))
        worst = min(worst, _rate(pol, rows, d.k) / best)
    assert worst > 0.97, worst


def _greedy_from_scratch(pol, rows, k_next):
    """The greedy path of ``GoodputPolicy._choose`` written plainly: every candidate's expert gain recomputed from
    the union at every pick (the policy keeps gains current incrementally; both must pick the same path)."""
    union, tokens, kv, num, smp = pol._base(rows)
    chains = pol._chains(rows, pol.K)
    c_tok, c_exp, c_smp = pol._coefs()
    t = pol._seconds(len(rows), tokens, union.size(), kv, k_next, pol._spec(k_next > 0), smp)
    spec = pol._spec(k_next > 0)
    k = {r.req: 0 for r in rows}
    best_rate, best = num / t * (1 + pol.spec.tolerance), dict(k)
    while True:
        cands = [((num + chains[r.req][k[r.req]]) / (t + cost), r, cost) for r in rows if k[r.req] < len(r.drafts)
                 for cost in [c_tok + c_exp * (union.a * union.gain(r.drafts[k[r.req]]) + union.more())
                              + (c_smp if r.sampled else 0.0)
                              + (pol.cost.current.coef["spec_pass"] if spec == 0 else 0.0)]]
        if not cands:
            return best
        rate, r, cost = max(cands, key=lambda c: c[0])  # the first of equal rates, as the policy
        num, t, spec = num + chains[r.req][k[r.req]], t + cost, 1.0
        union.add(r.drafts[k[r.req]])
        k[r.req] += 1
        if rate > best_rate:
            best_rate, best = rate, dict(k)


@pytest.mark.parametrize("accuracy", [None, 0.6])
def test_kept_gains_pick_the_path_of_gains_recomputed_every_pick(tmp_path, accuracy):
    rnd = random.Random(11)
    cost = {"fixed": 1e-3, "tokens": 1e-4, "expert_layers": 4e-5, "kv_slots": 0.0, "draft_steps": 0.0}
    spec = _spec(tmp_path, cost=cost, prior=(0.9, 0.7, 0.5), tolerance=0.0, accuracy=accuracy)
    tokens = [10, 11, 12, 20, 21, 22, 23, 5]
    differ = 0
    for _ in range(60):
        pol = P.GoodputPolicy(spec, 3, online=False)
        rows = [P.Row(f"r{i}", [rnd.choice(tokens) for _ in range(rnd.randrange(0, 4))], rnd.choice(tokens),
                      sampled=rnd.random() < 0.3) for i in range(rnd.randrange(1, 7))]
        avail = {r.req: len(r.drafts) for r in rows}
        choice = pol._choose(rows, avail, 0)[0]
        assert choice == _greedy_from_scratch(pol, rows, 0)
        token_only = P.GoodputPolicy(spec, 3, expert_cost=False, online=False)._choose(rows, avail, 0)[0]
        differ += choice != token_only
    assert differ > 0  # the expert gains changed some choices (else this test would not test them)


def test_pricing_units_is_pricing_their_shape():
    """``CostTerms.price`` (the decision's pricing, no shape dict) is ``seconds`` of the shape ``_shape`` makes."""
    rnd = random.Random(3)
    for _ in range(200):
        cost = P.CostTerms({k: rnd.choice([0.0, rnd.uniform(1e-6, 1e-2)]) for k in P.COST_TERMS})
        units = (rnd.randrange(1, 9), rnd.uniform(1, 48), rnd.uniform(0, 200), rnd.uniform(0, 1e4), rnd.randrange(6),
                 rnd.choice([0.0, 1.0]), rnd.uniform(0, 48))
        for expert_cost in (True, False):
            assert cost.price(*units, expert_cost) == pytest.approx(cost.seconds(P._shape(*units), expert_cost),
                                                                     rel=1e-12)


def test_the_all_drafts_shortcut_decides_as_the_greedy_path(tmp_path, monkeypatch):
    """``GoodputPolicy._all_or_nothing`` (every draft pays at the rate of verifying them all, so the greedy path's
    best prefix is all of them, or none) gives the choice, rate and shape of the greedy path it skips, and is taken
    in some steps and not in others (both paths exercised); so does it where some drafts do not pay at that rate
    but their shortfall is within the guard band's room (counted: within it in some steps, over it in others)."""
    rnd = random.Random(5)
    tokens = [10, 11, 12, 13, 20, 21, 22, 23, 5]
    taken = skipped = 0
    shortcut = P.GoodputPolicy._all_or_nothing
    shares = {True: 0, False: 0}  # the shortfall counted: within the guard band's room, over it
    shortfall = P.GoodputPolicy._shortfall

    def count(short, pending, rate, c_exp, slack):
        d = shortfall(short, pending, rate, c_exp, slack)
        shares[d <= slack] += 1
        return d

    monkeypatch.setattr(P.GoodputPolicy, "_shortfall", staticmethod(count))
    for case in range(480):
        cost = {"fixed": 1e-3, "tokens": rnd.choice([1e-5, 1e-4, 4e-4, 1e-3]), "rows": rnd.choice([0.0, 2e-4]),
                "expert_layers": rnd.choice([0.0, 2e-5, 2e-4]), "kv_slots": 0.0, "draft_steps": 1e-4,
                "spec_pass": rnd.choice([0.0, 5e-4]), "sampled_tokens": rnd.choice([0.0, 1e-4])}
        spec = _spec(tmp_path, cost=cost, prior=(0.9, 0.6, 0.3), tolerance=rnd.choice([0.0, 0.01, 0.1]),
                     accuracy=rnd.choice([None, 0.7, 0.3]))
        pol = P.GoodputPolicy(spec, 3, expert_cost=rnd.random() < 0.7, online=False, plain_steps=rnd.random() < 0.5)
        rows = [P.Row(f"r{i}", [rnd.choice(tokens) for _ in range(rnd.randrange(0, 4))], rnd.choice(tokens),
                      sampled=rnd.random() < 0.3) for i in range(rnd.randrange(1, 7))]
        for r in rows:
            for _ in range(rnd.randrange(0, 6)):
                pol.observe_step([(r.req, r.sampled, 3, rnd.randrange(0, 4))])
        avail = {r.req: len(r.drafts) for r in rows}
        k_next = rnd.choice([0, 1, 3])
        forced = [r.req for r in rows if rnd.random() < 0.15]
        got = {}

        def spy(*a, pol=pol, got=got, **k):
            got["full"] = shortcut(pol, *a, **k)
            return got["full"]

        monkeypatch.setattr(pol, "_all_or_nothing", spy)
        fast = pol._choose(rows, avail, k_next, forced)
        monkeypatch.setattr(pol, "_all_or_nothing", lambda *a, **k: None)
        slow = pol._choose(rows, avail, k_next, forced)
        assert fast[0] == slow[0] and fast[1] == pytest.approx(slow[1], rel=1e-12), case
        assert fast[2] == slow[2] and fast[3] == pytest.approx(slow[3], rel=1e-12), case
        taken += got.get("full") is not None
        skipped += "full" in got and got["full"] is None
    assert taken > 80 and skipped > 40, (taken, skipped)
    assert shares[True] > 5 and shares[False] > 5, shares


def test_the_shares_of_shared_expert_layers_are_counted_per_slot():
    """``_shortfall``'s bit-sliced count of how many drafts add each slot gives the shortfall of a per-slot count
    (each slot at ``c_expert / m``), up to 44 drafts over 20 or 128 slots (multiplicities past 16: five counter
    bits)."""
    from collections import Counter

    rnd = random.Random(3)
    deepest = 0
    for case in range(600):
        pending = []
        for _ in range(rnd.randrange(1, 45)):
            m = 0
            for b in rnd.sample(range(rnd.choice([20, 128])), rnd.randrange(0, 17)):
                m |= 1 << b
            pending.append((rnd.random() * 0.8, 1e-4, m, m.bit_count()))
        short = [d for d in pending if d[0] < 1e3 * (d[1] + 5e-5 * d[3]) and rnd.random() < 0.7]
        per_slot = Counter(b for _, _, m, _ in pending for b in range(128) if m >> b & 1)
        deepest = max(deepest, max(per_slot.values(), default=0))
        want = sum(max(0.0, 1e3 * (base + 5e-5 * sum(1.0 / per_slot[b] for b in range(128) if s >> b & 1)) - p)
                   for p, base, s, _ in short)
        assert P.GoodputPolicy._shortfall(short, pending, 1e3, 5e-5, -1.0) == pytest.approx(want, rel=1e-12,
                                                                                         abs=1e-12), case
    assert deepest > 16


def test_a_shorter_choice_must_beat_verifying_every_draft_by_the_tolerance(tmp_path):
    """The guard band: a token cost where verifying two of three drafts is expected to beat all three by ~0.5 %.
    Without a tolerance (or one under the gain) the shorter choice wins; with 1 % every draft is verified."""
    rows, cost = [P.Row("a", [20, 21, 22], 10)], {"fixed": 1e-3, "tokens": 4.9e-4}
    picks = {tol: P.GoodputPolicy(_spec(tmp_path, cost=cost, tolerance=tol), 3, online=False)._choose(
        rows, {"a": 3}, 0)[0]["a"] for tol in (0.0, 0.001, 0.01)}
    assert picks == {0.0: 2, 0.001: 2, 0.01: 3}


def test_the_proposal_is_the_best_fixed_length_while_speculation_pays(tmp_path):
    """K_next: the best length for the shared rates (3 here) stays while the request's own factor falls, with or
    without a tolerance (the factor decides whether to speculate, not how far: 3-4 draft cuts at batch 1 cost vLLM
    more steps than their draft passes saved); a request whose drafts stop being accepted goes to the floor."""
    cost = {"fixed": 1e-3, "tokens": 1e-4, "draft_steps": 2e-4}
    rows = [P.Row("a", [], 10, 5)]
    for tol in (0.0, 0.01):
        pol = P.GoodputPolicy(_spec(tmp_path, cost=cost, tolerance=tol), 3, online=False)
        seen = [pol.decide(rows).k_next]
        for _ in range(3):  # the request accepts 2 of 3 drafts, under the shared rates: its factor falls
            pol.observe_step([("a", False, 3, 2)])
            seen.append(pol.decide(rows).k_next)
        assert seen == [3, 3, 3, 3] and pol.acceptance.factor("a") < 0.95
        for _ in range(20):  # nothing accepted any more: the floor beats every length for this request
            pol.observe_step([("a", False, 3, 0)])
        assert pol.decide(rows).k_next == 0


def test_a_shorter_proposal_must_beat_the_longest_by_the_tolerance(tmp_path):
    """K_next: where a shorter proposal's expected rate is above a longer one's by less than the tolerance (2
    drafts 1.5 % over 3 here), the longer one is proposed; without a tolerance, or where the shorter one's gain is
    larger (5.7 %), the shorter one."""
    rows = [P.Row("a", [], 10, 5)]

    def k_next(draft_steps, tol):
        cost = {"fixed": 1e-3, "tokens": 1e-4, "draft_steps": draft_steps}
        pol = P.GoodputPolicy(_spec(tmp_path, cost=cost, tolerance=tol), 3, online=False)
        rates = pol._plan_rates(rows, 0, pooled=True)
        return pol.decide(rows).k_next, rates[2] / rates[3]

    assert k_next(3e-4, 0.0)[0] == 2 and 1.0 < k_next(3e-4, 0.0)[1] < 1.02
    assert k_next(3e-4, 0.02)[0] == 3
    assert k_next(5e-4, 0.02)[0] == 2 and k_next(5e-4, 0.02)[1] > 1.02


def test_the_plan_beats_the_floor_as_the_full_rates_say(tmp_path):
    """``_plan`` asks only whether the reference length beats plain decoding: where verifying all of its drafts
    does, it takes that rate (``over_floor``, no sort of the drafts); its K_next is the one of the rates walked in
    full, on random batches, costs and acceptance, and the short way is taken in some cases and not in others."""
    rnd = random.Random(11)
    short = full = 0
    for case in range(300):
        cost = {"fixed": 1e-3, "tokens": rnd.choice([1e-5, 1e-4, 4e-4, 1e-3]), "rows": rnd.choice([0.0, 2e-4]),
                "expert_layers": rnd.choice([0.0, 2e-5, 2e-4]), "kv_slots": 0.0,
                "draft_steps": rnd.choice([1e-5, 2e-4, 1e-3]), "spec_pass": rnd.choice([0.0, 5e-4]),
                "sampled_tokens": rnd.choice([0.0, 1e-4])}
        spec = _spec(tmp_path, cost=cost, prior=(0.9, 0.6, 0.3), tolerance=rnd.choice([0.0, 0.01, 0.1]),
                     accuracy=rnd.choice([None, 0.7, 0.3]))
        pol = P.GoodputPolicy(spec, 3, expert_cost=rnd.random() < 0.7, online=False, plain_steps=rnd.random() < 0.5)
        rows = [P.Row(f"r{i}", [], rnd.choice([10, 11, 20, 5]), 5, sampled=rnd.random() < 0.3)
                for i in range(rnd.randrange(1, 7))]
        for r in rows:
            for _ in range(rnd.randrange(0, 6)):
                pol.observe_step([(r.req, r.sampled, 3, rnd.randrange(0, 4))])
        least = rnd.choice([0, 0, 1])
        ref = pol._reference(rows, least)
        if ref > 0:
            quick = pol._plan_rates(rows, least, pooled=False, lengths=(0, ref), over_floor=True)
            walked = pol._plan_rates(rows, least, pooled=False, lengths=(0, ref))
            short += quick[ref] != walked[ref]
            full += quick[ref] == walked[ref]
            assert (quick[ref] > quick.get(0, -1.0)) == (walked[ref] > walked.get(0, -1.0)), case
            assert quick.get(0) == walked.get(0), case
        expected = ref if ref > 0 and walked[ref] > walked.get(0, -1.0) else \
            pol._longest_within(pol._plan_rates(rows, least, pooled=False))
        assert pol._plan(rows, least) == expected, case
    assert short > 30 and full > 30, (short, full)


def test_the_longest_length_within_the_tolerance_still_beats_the_floor(tmp_path):
    """The guard band between proposal lengths never takes a length under plain decoding's rate (which carries the
    tolerance): of lengths within the tolerance of the best, only those over the floor count."""
    pol = P.GoodputPolicy(_spec(tmp_path, tolerance=0.05), 3, online=False)
    assert pol._longest_within({0: 100.0, 1: 104.0, 2: 101.0, 3: 99.5}) == 2
    assert pol._longest_within({0: 100.0, 1: 104.0, 2: 103.0, 3: 102.0}) == 3
    assert pol._longest_within({0: 100.0, 1: 99.0, 2: 98.0, 3: 97.0}) == 0


def test_the_fixed_reference_is_planned_again_after_ref_steps(tmp_path):
    """The best fixed length is kept for ``REF_STEPS`` steps, then planned again from the shared rates: after the
    third draft stops being accepted by every request, the reference falls with it."""
    cost = {"fixed": 1e-3, "tokens": 1e-4, "draft_steps": 2e-4}
    pol = P.GoodputPolicy(_spec(tmp_path, cost=cost, tolerance=0.01), 3, online=False)
    rows = [P.Row("a", [], 10, 5)]
    assert pol.decide(rows).k_next == 3
    for i in range(60):  # other requests: two drafts accepted, never the third (the shared rates fall)
        pol.observe_step([(f"o{i}", False, 3, 2)])
    kept = [pol.decide(rows).k_next for _ in range(P.REF_STEPS)]
    assert kept[:P.REF_STEPS - 1] == [3] * (P.REF_STEPS - 1) and kept[-1] < 3


def test_k_next_pays_for_the_draft_passes(tmp_path):
    """The proposer's draft passes cost time: expensive ones shorten (or stop) the next proposal."""
    base = {"fixed": 1e-3, "tokens": 1e-4, "expert_layers": 0.0, "kv_slots": 0.0}
    rows = [P.Row("a", [20, 21, 22], 10)]
    cheap = P.GoodputPolicy(_spec(tmp_path, cost={**base, "draft_steps": 1e-5}), 3, online=False).decide(rows)
    dear = P.GoodputPolicy(_spec(tmp_path, cost={**base, "draft_steps": 2e-3}), 3, online=False).decide(rows)
    assert cheap.k_next == 3 and dear.k_next < cheap.k_next


def test_rows_are_priced_and_the_token_only_variant_takes_its_own_cost(tmp_path):
    """A step's ``rows`` term is paid per request; ``expert_cost = False`` prices with the file's
    ``cost_tokens`` (fitted without the expert term), the expert-aware policy with ``cost``."""
    cost = {"fixed": 1e-3, "rows": 5e-4, "tokens": 1e-4, "expert_layers": 2e-5, "draft_steps": 0.0}
    tok = {"fixed": 2e-3, "rows": 1e-3, "tokens": 3e-4}
    spec = _spec(tmp_path, cost=cost, cost_tokens=tok)
    rows = [P.Row(r, [], 10 + i) for i, r in enumerate("abcd")]
    pol = P.GoodputPolicy(spec, 3, online=False)
    d = pol.decide(rows)
    assert d.shape["rows"] == 4
    assert d.ar_rate == pytest.approx(4 / (1e-3 + 4 * 5e-4 + 4 * 1e-4 + 2e-5 * d.shape["expert_layers"]))
    d_t = P.GoodputPolicy(spec, 3, online=False, expert_cost=False).decide(rows)
    assert d_t.ar_rate == pytest.approx(4 / (2e-3 + 4 * 1e-3 + 4 * 3e-4))
    # without cost_tokens the token-only variant keeps cost, less its expert term (as before)
    d_0 = P.GoodputPolicy(_spec(tmp_path, cost=cost), 3, online=False, expert_cost=False).decide(rows)
    assert d_0.ar_rate == pytest.approx(4 / (1e-3 + 4 * 5e-4 + 4 * 1e-4))


def test_the_next_step_is_planned_with_unknown_roots(tmp_path):
    """K_next prices the next step's roots as unknown tokens (they are what this step samples): the plan does not
    depend on which tokens this step's roots are. Before, 8 rows that shared a root (a batch's first decode step)
    priced the floor by that one token's experts, cheaper than the floor is, and each batch took its first 8 steps
    plain (vLLM, batch 8, T = 0)."""
    cost = {"fixed": 1e-3, "rows": 1e-4, "tokens": 1e-4, "expert_layers": 4e-4, "draft_steps": 5e-4, "spec_pass": 1e-3}
    spec = _spec(tmp_path, cost=cost, prior=(0.9, 0.7, 0.5))
    same = [P.Row(f"r{i}", [], 10, 50) for i in range(8)]
    apart = [P.Row(f"r{i}", [], 20 + i % 4, 50) for i in range(8)]
    plans = {P.GoodputPolicy(spec, 3, online=False, plain_steps=True)._plan(rows) for rows in (same, apart)}
    assert len(plans) == 1 and plans.pop() > 0


# ------------------------------------------------------------------------------------------ online cost
def test_online_cost_refit_recovers_the_machine_coefficients(tmp_path):
    prior = {"fixed": 2e-3, "tokens": 1e-4, "expert_layers": 1e-5, "kv_slots": 0.0, "draft_steps": 1e-4}
    truth = {"fixed": 1e-3, "tokens": 3e-4, "expert_layers": 2e-5, "kv_slots": 0.0, "draft_steps": 5e-4}
    oc = P.OnlineCost(P.CostTerms(prior), prior_weight=1e-3)
    rnd = random.Random(3)
    for _ in range(200):
        x = {"fixed": 1.0, "tokens": rnd.randrange(1, 40), "expert_layers": rnd.randrange(8, 64),
             "kv_slots": 0.0, "draft_steps": rnd.randrange(0, 6)}
        oc.observe(x, P.CostTerms(truth).seconds(x))
    oc.refit()
    for k in ("fixed", "tokens", "expert_layers", "draft_steps"):
        assert oc.current.coef[k] == pytest.approx(truth[k], rel=0.05), k
    assert all(v >= 0 for v in oc.current.coef.values())


def test_runs_of_one_shape_enter_the_fit_as_one_weighted_row():
    """Floor steps of the same requests differ only in their KV slots: a run of them enters as one row of weight m.
    With the steps' times +-2 % apart and their slots the same or growing a token a step, the fit stays within 2 %
    of the fit of the steps one by one (and both near the machine's coefficients)."""
    prior = {"fixed": 2e-3, "tokens": 1e-4, "expert_layers": 1e-5, "kv_slots": 1e-7, "draft_steps": 1e-4}
    truth = P.CostTerms({"fixed": 1e-3, "tokens": 3e-4, "expert_layers": 2e-5, "kv_slots": 2e-7, "draft_steps": 5e-4})
    rnd = random.Random(5)
    steps = []
    for _ in range(60):  # runs of 1-12 steps of one shape, their KV growing a token per step (or not)
        x = {"fixed": 1.0, "tokens": rnd.randrange(1, 40), "expert_layers": rnd.randrange(8, 64),
             "kv_slots": float(rnd.randrange(100, 900)), "draft_steps": rnd.randrange(0, 6)}
        for i in range(rnd.randrange(1, 13)):
            steps.append((x, i))
    fits = {}
    for batch in (1, 8):
        for growing in (False, True):
            oc = P.OnlineCost(P.CostTerms(prior), window=10_000, prior_weight=1e-3, every=10_000, batch=batch)
            for x, i in steps:
                x = dict(x, kv_slots=x["kv_slots"] + (i if growing else 0))
                oc.observe(x, truth.seconds(x) * (1.0 + 0.02 * (i % 3 - 1)))  # step-to-step noise of +-2 %
            oc.refit()
            fits[batch, growing] = oc.current.coef
            assert oc._w == len(steps)
        assert len(oc.obs) < len(steps) if batch > 1 else len(oc.obs) == len(steps)
    for k in truth.coef:
        assert fits[8, False][k] == pytest.approx(fits[1, False][k], rel=0.02, abs=1e-9), k
        assert fits[8, True][k] == pytest.approx(fits[1, True][k], rel=0.02, abs=1e-9), k
        assert fits[1, True][k] == pytest.approx(truth.coef[k], rel=0.25), k


def test_online_flag_off_keeps_the_file_coefficients(tmp_path):
    spec = _spec(tmp_path)
    pol = P.GoodputPolicy(spec, 3, online=False)
    for _ in range(40):
        pol.observe_time({"fixed": 1.0, "tokens": 4.0}, 1.0)
    assert pol.cost.current.coef == spec.cost.coef


def test_online_cost_learns_a_term_the_file_left_at_zero():
    prior = {"fixed": 1e-3, "tokens": 2e-4, "expert_layers": 0.0, "kv_slots": 0.0, "draft_steps": 0.0}
    truth = {"fixed": 1e-3, "tokens": 1e-4, "expert_layers": 3e-5, "kv_slots": 0.0, "draft_steps": 0.0}
    oc = P.OnlineCost(P.CostTerms(prior), prior_weight=1e-3)
    rnd = random.Random(5)
    for _ in range(200):
        t = rnd.randrange(1, 40)
        x = {"fixed": 1.0, "tokens": t, "expert_layers": rnd.randrange(t, 4 * t + 8)}
        oc.observe(x, P.CostTerms(truth).seconds(x))
    oc.refit()
    assert oc.current.coef["expert_layers"] == pytest.approx(3e-5, rel=0.1)


# ------------------------------------------------------------------------------------------ the step log
def test_step_lines_are_the_json_of_the_step():
    """The scheduler's log line (joined by hand, ids encoded once) reads back as ``json`` writes the step, for ids
    that need escaping and for rates that are not finite."""
    from specmoe_vllm.steplog import StepLine

    enc = StepLine()
    ids = ["0-a22911c5", 'q"uote', "back\\slash", "ünï", "tab\there"]
    for step, rate in enumerate([0.0, 304.70720088, float("inf"), 1e-300]):
        held = {r: i for i, r in enumerate(ids)}
        k = {r: max(0, i - 1) for i, r in enumerate(ids)}
        sched = {r: v for r, v in k.items() if v}
        line = enc.line(step, held, k, sched, 3, rate, 83.4)
        assert line.endswith("\n")
        want = {"step": step, "held": held, "k": k, "scheduled": sched, "k_next": 3,
                "rate": rate if rate != float("inf") else None, "ar_rate": 83.4}
        assert json.loads(line) == want
    enc.forget(ids[1])
    assert ids[1] not in enc._ids and json.loads(enc.line(9, {}, {}, {}, 0, 1.0, 1.0))["held"] == {}
