# SPDX-License-Identifier: Apache-2.0
"""The AR floor: the engine switches between plain AR steps and speculation inside one generation and stays
lossless (greedy == AR on the three architectures with the EAGLE-3, MTP and draft-model drafters, batch 1 and 3;
switching is forced by a huge floor margin, so every probe falls back on the back-off schedule); a drafter that
absorbs the tokens of several AR steps at once drafts what it would have drafted absorbing them step by step;
the engine feeds an adaptive selector's models (cost windows with AR and speculative passes, acceptance
outcomes); the back-off schedule itself."""

from __future__ import annotations

import pytest
import torch
from fixtures.agreeing import MIN_MULTI
from fixtures.tiny import random_prompts

from specmoe.decoding.ar import ar_generate
from specmoe.decoding.ar_floor import ARFloor
from specmoe.decoding.engine import SpeculativeEngine, merge_committed, pad_rows
from specmoe.decoding.stopping import StopRule
from specmoe.interfaces.drafter import Committed
from specmoe.registry import drafters, predictors, selectors

MAX_NEW = 20
#: goodput whose verified tokens are cheap (deep trees are verified) and whose floor always falls back after a
#: speculative step: spec, AR x2, spec, AR x4, spec, AR x4, ...
FORCED = {"coefficients": {"fixed": 5e-3, "tokens": 1e-6, "expert_layers": 1e-6}, "floor_margin": 1e9,
          "probe_after": 2, "probe_max": 4, "floor_tolerance": 0.0}
DRAFTS = {"eagle3": ("eagle3", "eagle3"), "mtp": ("mtp", "mtp_dense"), "draft_model": ("draft_model", "draft_lm")}


def _switched_after_ar(gens) -> int:
    """Speculative steps right after an AR step that appended two or more tokens in some row."""
    n = 0
    for g in gens:
        for prev, cur in zip(g.steps, g.steps[1:]):
            n += (not prev.speculative) and cur.speculative and max(cur.accepted, default=0) >= 2
    return n


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_greedy_equals_ar_with_switching(make_predictable, agreeing_drafts, arch, draft):
    name, kind = DRAFTS[draft]
    target, _ = make_predictable(arch)
    drafter = drafters.get(name)(path=str(agreeing_drafts(arch, kind)))
    drafter.setup(target)
    pred = predictors.get("router_on_embedding")()
    pred.setup(target)
    prompts = random_prompts(3, [3, 12, 29], target.vocab_size, seed=4)  # tiny GPT-OSS window is 8
    free = ar_generate(target, prompts[:1], temperature=0, stop=StopRule(MAX_NEW))
    stop = StopRule(MAX_NEW, stop_ids=[free.tokens[0][7]])
    refs = [ar_generate(target, [p], temperature=0, stop=stop).tokens[0] for p in prompts]
    engine = SpeculativeEngine(target, drafter, selectors.get("goodput")(**FORCED), pred)
    gens = []
    for p, ref in zip(prompts, refs):
        out = engine.generate([p], budget=4, steps=3, top_k=2, temperature=0, stop=stop)
        assert out.tokens[0] == ref, f"{arch} {draft} prompt len {len(p)}"
        gens.append(out)
    out = engine.generate(prompts, budget=4, steps=3, top_k=2, temperature=0, stop=stop)
    assert out.tokens == refs, f"{arch} {draft} batch"
    gens.append(out)
    steps = [s for g in gens for s in g.steps]
    ar_steps = [s for s in steps if not s.speculative]
    assert ar_steps and all(s.verified == [1] * len(s.accepted) for s in ar_steps)
    spec_acc = [a for s in steps if s.speculative for a in s.accepted]
    share = sum(a >= 2 for a in spec_acc) / len(spec_acc)
    assert share >= MIN_MULTI, f"{arch} {draft}: {share:.2f} of speculative steps accepted a draft"
    assert _switched_after_ar(gens) >= 3, "drafting after AR steps must still agree with the target"
    assert engine.floor.counts["fall_back"] >= 3 and engine.floor.counts["speculate"] == 0


@pytest.mark.parametrize("draft", ["eagle3", "mtp"])
def test_absorbing_ar_blocks_at_once_drafts_the_same(make_predictable, agreeing_drafts, draft):
    """``draft(merge(A, B))`` from a fresh state == ``draft(A)`` then ``draft(B)``: the features of tokens
    committed by AR steps reach the drafter as if it had absorbed them one step at a time."""
    name, kind = DRAFTS[draft]
    target, _ = make_predictable("qwen3_moe")
    drafter = drafters.get(name)(path=str(agreeing_drafts("qwen3_moe", kind)))
    drafter.setup(target)
    rows = random_prompts(2, [9, 14], target.vocab_size, seed=3)
    seqs = [r + ar_generate(target, [r], temperature=0, stop=StopRule(6)).tokens[0] for r in rows]
    f_dim = None
    blocks = []
    cuts = [(0, 8, 12), (0, 13, 18)]  # per row: [0, a) then [a, b)
    feats_rows = []  # per row [len, F]: token i's feature is the target's hidden state at position i - 1
    for s in seqs:
        kv = target.new_kv(1, capacity=len(s) + 4)
        ids = torch.tensor([s])
        o = target.forward(ids, kv, torch.arange(len(s))[None], None, None, hidden_layers=drafter.feature_layers)
        f = torch.zeros(1, len(s), o.hidden.shape[-1])
        f[:, 1:] = o.hidden[:, :-1]
        feats_rows.append(f[0])
        f_dim = o.hidden.shape[-1]
    for part in (0, 1):
        toks, poss = [], []
        for b, s in enumerate(seqs):
            lo, hi = (cuts[b][0], cuts[b][1]) if part == 0 else (cuts[b][1], cuts[b][2])
            toks.append(s[lo:hi])
            poss.append(list(range(lo, hi)))
        ids, valid = pad_rows(toks, torch.device("cpu"))
        pos, _ = pad_rows(poss, torch.device("cpu"))
        feat = torch.zeros(*ids.shape, f_dim)
        for b in range(len(seqs)):
            lo = cuts[b][0] if part == 0 else cuts[b][1]
            n = len(toks[b])
            feat[b, :n] = feats_rows[b][lo:lo + n]
        blocks.append(Committed(ids, valid, pos, feat, first=part == 0))
    st = drafter.begin(2)
    drafter.draft(st, blocks[0], 3, 2)
    step_by_step = drafter.draft(st, blocks[1], 3, 2)
    merged = merge_committed(blocks)
    assert merged.valid.sum(dim=1).tolist() == [12, 18] and merged.first
    at_once = drafter.draft(drafter.begin(2), merged, 3, 2)
    assert torch.equal(step_by_step.tokens, at_once.tokens)
    torch.testing.assert_close(step_by_step.path_logp, at_once.path_logp, atol=1e-4, rtol=1e-4)


def test_engine_feeds_the_adaptive_selector(make_predictable, agreeing_drafts):
    """AR and speculative passes reach the cost model's window; accept results reach the acceptance model."""
    target, _ = make_predictable("gpt_oss")
    drafter = drafters.get("eagle3")(path=str(agreeing_drafts("gpt_oss", "eagle3")))
    drafter.setup(target)
    pred = predictors.get("router_on_embedding")()
    pred.setup(target)
    sel = selectors.get("goodput")(**FORCED)
    engine = SpeculativeEngine(target, drafter, sel, pred)
    accepted_edges = []  # accepted non-root nodes per speculative outcome (each is an edge with an accepted parent)
    observe = sel.observe
    sel.observe = lambda o: (accepted_edges.append(int(o.accepted.sum()) - int(o.accepted[:, 0].sum()))
                             if o.speculative else None, observe(o))
    prompts = random_prompts(2, [5, 9], target.vocab_size, seed=6)
    gens = [engine.generate(prompts, budget=4, steps=3, top_k=2, temperature=0, stop=StopRule(MAX_NEW))
            for _ in range(10)]
    steps = [s for g in gens for s in g.steps]
    n_obs = sum(s.speculative for s in steps) + sum(sum(not s.speculative for s in g.steps) // 8 for g in gens)
    assert len(sel.cost._obs) == n_obs >= sel.cost.min_fit  # every speculative pass, one AR pass in 8
    assert sel.cost.coefficients() != dict(zip(sel.cost.features, sel.cost.prior.tolist()))  # refitted
    n_nodes = sum(sum(s.verified) - len(s.verified) for s in steps if s.speculative)
    # edge outcomes: verified non-root nodes whose parent was accepted; every accepted one is a success
    win = sel.acceptance._win[0.0]
    assert win.data()[1].sum() == sum(accepted_edges) > 0 and sum(accepted_edges) < win.n <= n_nodes
    assert sel.cost.predict_part("t_draft", 2) > 0
    cal = sel.calibration()
    assert cal["cost"]["n"] == n_obs and cal["acceptance"]["0.0"]["n"] == win.n


def test_backoff_schedule():
    floor = ARFloor(margin=1.0, probe_after=2, probe_max=8, tolerance=0.0)
    floor.begin(1, 0.0)
    pattern = []
    for _ in range(30):
        spec = floor.speculate()
        pattern.append("S" if spec else "A")
        if spec:
            floor.decide(1.0, 1.0, 1, predicted_ar_rate=10.0)  # speculation pays a tenth of AR
    assert "".join(pattern) == "SAASAAAASAAAAAAAASAAAAAAAASAAA"
    floor.decide(100.0, 1.0, 1, predicted_ar_rate=10.0)  # a probe that pays resets the wait
    floor.decide(1.0, 1.0, 1, predicted_ar_rate=10.0)
    assert floor.state.wait == 2
    floor.observe_ar(1, 0.01)  # measured AR: 100 tokens/s overrides the predicted rate
    assert floor.ar_rate(1) == pytest.approx(100.0) and floor.ar_rate(3) == pytest.approx(100.0)
    floor.begin(4, 0.0)  # another regime starts fresh
    assert floor.speculate() and floor.ar_rate(1) is None
    # once EVIDENCE decided steps showed that speculation does not pay, the wait is at least what keeps failed
    # probes under `tolerance` of the time, charged by the measured step: a probe that took 0.3 s and committed
    # one token, against AR steps of 0.1 s, lost 2 AR steps' worth -> >= ceil(2 / 0.05) = 40 steps (whatever its
    # plan predicted); before that, the back-off alone
    costly = ARFloor(margin=1.0, probe_after=4, probe_max=64, tolerance=0.05)
    costly.begin(1, 0.0)
    waits = []
    for _ in range(7):
        costly.decide(1.0, 0.2, 1, predicted_ar_rate=10.0)
        assert costly.state.wait in (4, 8, 16, 32, 64)  # the back-off until the step is measured
        costly.observe_step(0.3, 1, 1)
        waits.append(costly.state.wait)
    assert waits == [4, 8, 16, 40, 64, 64, 64]
    costly.observe_step(10.0, 1, 1)  # charged once per fall-back
    assert costly.state.wait == 64
    costly.decide(2.9, 0.3, 1, predicted_ar_rate=10.0)  # a near miss after a reset: the back-off alone
    costly.decide(100.0, 0.3, 1, predicted_ar_rate=10.0)
    costly.observe_step(10.0, 1, 1)  # a step whose plan paid is never charged
    costly.decide(2.9, 0.3, 1, predicted_ar_rate=10.0)
    costly.observe_step(0.3, 3, 1)  # measured: no loss
    assert costly.state.wait == 4
    never = ARFloor(margin=0.0)
    never.begin(1, 0.0)
    assert never.decide(0.0, 1.0, 1, predicted_ar_rate=1e9) and never.speculate()


def test_a_provisional_plan_decides_nothing():
    """A plan priced with a catch-up it cannot yet separate neither falls back nor resets the back-off."""
    floor = ARFloor(margin=1.0, probe_after=2, probe_max=8, tolerance=0.0)
    floor.begin(1, 0.0)
    assert not floor.decide(1.0, 1.0, 1, predicted_ar_rate=10.0)  # fails: waits 2, next back-off 4
    state = (floor.state.wait, floor.state.backoff)
    assert floor.decide(1.0, 1.0, 1, predicted_ar_rate=10.0, provisional=True)
    assert (floor.state.wait, floor.state.backoff) == state
    assert floor.counts == {"speculate": 0, "fall_back": 1, "provisional": 1}


def test_a_catch_up_is_charged_only_where_speculation_does_not_pay():
    """The first step of a generation drafts the whole prompt, a catch-up paid once whenever speculation
    starts. Until EVIDENCE (4) decided steps were seen, and where they showed that speculation pays (catch-ups
    left out, they beat AR), a failed probe waits the back-off alone; where they showed it does not pay, it is
    charged the whole step, catch-up included."""
    def probe(floor, seconds, tokens, catch_up):
        assert not floor.decide(1.0, 0.2, 1, predicted_ar_rate=1.0, catch_up=catch_up)
        floor.observe_step(seconds, tokens, 1)
        return floor.state.wait

    def fresh():
        floor = ARFloor(margin=1.0, probe_after=4, probe_max=64, tolerance=0.05)
        floor.begin(1, 0.0)
        floor.observe_ar(1, 0.1)  # AR: 10 tokens/s
        return floor

    # no evidence yet (fewer than EVIDENCE decided steps): one step cannot tell a bad step from a regime that
    # does not pay -> the back-off alone, even for 0.5 s and 1 token (2 AR steps lost without the catch-up)
    assert probe(fresh(), 0.5, 1, 0.2) == 4
    assert probe(fresh(), 0.5, 4, 0.2) == 4
    losing = fresh()
    for _ in range(4):  # speculation does not pay here: steps of 0.3 s commit 1 token
        losing.decide(1.0, 0.2, 1, predicted_ar_rate=1.0)
        losing.observe_step(0.3, 1, 1)
    assert not losing.pays()
    assert probe(losing, 0.5, 1, 0.2) == 80  # the catch-up is charged too
    paying = fresh()
    for _ in range(4):  # speculation pays: 0.3 s steps commit 5 tokens
        assert paying.decide(100.0, 0.2, 1, predicted_ar_rate=1.0)
        paying.observe_step(0.3, 5, 1)
    assert paying.pays() and probe(paying, 0.5, 1, 0.2) == 4  # seen to pay: a bad step waits the back-off
    cut = fresh()
    assert not cut.decide(1.0, 0.2, 1, predicted_ar_rate=1.0)
    cut.observe_step(0.5, 1, 1, truncated=True)  # the stop rule left one token to commit: not evidence
    assert cut.state.wait == 4 and len(cut.state.realised) == 0
    provisional = fresh()
    provisional.decide(1.0, 0.2, 1, predicted_ar_rate=1.0, provisional=True)
    provisional.observe_step(0.3, 0, 1)  # a provisional step is not evidence
    assert len(provisional.state.realised) == 0


def test_the_plan_rate_is_corrected_by_what_the_regime_realised():
    """Plans that under-expect (an acceptance model still learning the regime) stop holding a paying regime on
    AR once 4 decided steps were measured; plans that over-expect are held back alike (factor clamped)."""
    under = ARFloor(margin=1.0, probe_after=1, probe_max=1, tolerance=0.0)
    under.begin(2, 0.0)
    under.observe_ar(2, 0.005)  # AR: 400 tokens/s
    for _ in range(4):  # plans: 5 tokens in 14 ms (357 tokens/s) -> fall back, while plans are all there is
        assert not under.decide(5.0, 0.014, 2, predicted_ar_rate=1.0)
        under.observe_step(0.014, 8, 2)  # yet each such step committed 8 tokens
    assert under.realisation() == pytest.approx(1.6)
    assert under.decide(5.0, 0.014, 2, predicted_ar_rate=1.0)  # 357 x 1.6 = 571 tokens/s
    over = ARFloor(margin=1.0, probe_after=1, probe_max=1, tolerance=0.0)
    over.begin(2, 0.0)
    over.observe_ar(2, 0.005)
    for _ in range(4):  # plans: 7 tokens in 10 ms (700 tokens/s); measured: 1 token in 20 ms
        assert over.decide(7.0, 0.010, 2, predicted_ar_rate=1.0)
        over.observe_step(0.020, 1, 2)
    assert over.realisation() == 0.5  # clamped (measured 0.07)
    assert not over.decide(7.0, 0.010, 2, predicted_ar_rate=1.0)  # 700 x 0.5 = 350 < 400
    over.begin(4, 0.0)
    assert over.realisation() == 1.0  # per regime


def test_an_ar_stretch_is_one_block_equal_to_its_steps_merged():
    """The engine keeps a stretch of AR steps as host lists and builds one :class:`Committed` at the next
    speculative step: equal to the per-step blocks merged (tokens, validity, positions, features), a row that
    finishes inside the stretch included (its later entries invalid, its positions no longer advancing)."""
    from specmoe.decoding.engine import _Run

    torch.manual_seed(0)
    bsz, f_dim = 3, 5
    start = torch.tensor([7, 12, 4])  # each row's next root position when the stretch begins
    active = [[True, True, True], [True, False, True], [True, False, True], [True, False, False]]
    run = _Run(bsz=bsz, kv=None, gen=None, clock=None, temperature=0.0, stop=None, feat_layers=[], outputs=[],
               active=[], active_t=torch.ones(bsz, dtype=torch.bool), last_tok=[], pending=[],
               ar_attend=None, ar_pos=start.clone())
    per_step, pos = [], start.clone()
    for j, act in enumerate(active):
        sel = torch.tensor(act)[:, None]
        toks = [100 + 10 * j + b if act[b] else 0 for b in range(bsz)]
        feats = torch.randn(bsz, 1, f_dim)
        run.ar_steps.append((toks, sel, feats))
        per_step.append(Committed(torch.tensor(toks)[:, None], sel, pos[:, None] + 1,
                                  feats * sel[:, :, None].float()))
        pos = pos + sel[:, 0].long()
    run.ar_pos = pos
    block = SpeculativeEngine._ar_block(run)
    merged = merge_committed(per_step)
    assert run.ar_steps == [] and run.ar_pos is None
    assert torch.equal(block.valid, merged.valid) and block.valid.sum(dim=1).tolist() == [4, 1, 3]
    v = block.valid
    assert torch.equal(block.tokens[v], merged.tokens[v]) and torch.equal(block.positions[v], merged.positions[v])
    assert block.positions[0].tolist() == [8, 9, 10, 11] and block.positions[1, 0] == 13
    torch.testing.assert_close(block.features, merged.features)
