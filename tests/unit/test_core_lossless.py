# SPDX-License-Identifier: Apache-2.0
"""Greedy speculative decoding equals autoregressive decoding token for token (the first test of any change
to decoding): three architectures x every registered selector x gamma in {2, 4, 6}, 8 prompts, with stop tokens
and max-length cut-offs, batch 1 and batch 4 (there also with the ``draft_head`` predictor on the drafter's node
features); every case also asserts that at least 30 % of its steps accepted a draft token (two or more tokens
appended), so the acceptance paths are what is compared."""

from __future__ import annotations

import pytest
import torch
from fixtures.agreeing import MIN_MULTI, context_share, multi_token_share
from fixtures.tiny import random_prompts

from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.stopping import StopRule
from specmoe.registry import drafters, predictors, selectors

MAX_NEW = 18
#: goodput with fixed costs where a verified token is cheap next to a step, so it verifies deep paths as the other
#: selectors do (its uncalibrated prior prices tokens as on the CPU demo and often verifies the root alone); no
#: online refit and no AR floor here: a self-drafting target costs a target pass per draft level, so measured
#: costs would rightly send it to AR steps (tests/unit/test_ar_floor.py covers the switching)
SELECTOR_OPTIONS = {"goodput": {"coefficients": {"fixed": 5e-3, "tokens": 1e-6, "expert_layers": 1e-6},
                                "online": False, "ar_floor": False}}


def _setup(target, drafter_opts):
    drafter = drafters.get("draft_model")(**drafter_opts)
    drafter.setup(target)
    pred = predictors.get("router_on_embedding")()
    pred.setup(target)
    # GPT-OSS sliding window is 8: most prompts are longer
    prompts = random_prompts(8, [3, 12, 21, 30], target.vocab_size, seed=1)
    free = ar_generate(target, prompts[:1], temperature=0, stop=StopRule(MAX_NEW))
    stop_id = free.tokens[0][6]  # a token the model does produce: exercises stop handling
    return drafter, pred, prompts, StopRule(MAX_NEW, stop_ids=[stop_id])


@pytest.mark.parametrize("draft", ["self_draft", "small_draft"])
def test_greedy_equals_ar_every_selector(make_target, make_predictable, agreeing_drafts, arch, draft):
    """``self_draft``: the random tiny target drafts for itself; ``small_draft``: a one-layer draft LM made of
    the predictable target's own first layer (``fixtures/agreeing.py``). Both agree with the target often:
    every selector must see at least :data:`MIN_MULTI` of its steps append two or more tokens."""
    if draft == "self_draft":
        target, opts = make_target(arch), {"share_target": True}
    else:
        target, opts = make_predictable(arch)[0], {"path": str(agreeing_drafts(arch, "draft_lm"))}
    drafter, pred, prompts, stop = _setup(target, opts)
    refs = [ar_generate(target, [p], temperature=0, stop=stop).tokens[0] for p in prompts]
    assert any(len(r) < MAX_NEW for r in refs), "the stop token should end some outputs early"
    assert any(len(r) == MAX_NEW for r in refs), "some outputs should hit max_new_tokens"
    for sel_name in selectors.names():
        selector = selectors.get(sel_name)(**SELECTOR_OPTIONS.get(sel_name, {}))
        engine = SpeculativeEngine(target, drafter, selector, pred)
        gens = []
        for gamma in (2, 4, 6):
            for p, ref in zip(prompts, refs):
                out = engine.generate([p], budget=gamma, steps=3, top_k=2, temperature=0, stop=stop)
                assert out.tokens[0] == ref, f"{arch} {sel_name} gamma={gamma} prompt len {len(p)}"
                assert all(len(s.verified) == 1 and s.verified[0] <= gamma for s in out.steps)
                gens.append(out)
        share = multi_token_share(gens)
        assert share >= MIN_MULTI, f"{arch} {draft} {sel_name}: only {share:.2f} of steps accepted a draft"


def test_batched_greedy_equals_ar(make_target, arch):
    target = make_target(arch)
    drafter, pred, prompts, stop = _setup(target, {"share_target": True})
    head = predictors.get("draft_head")(init={"seed": 0, "rank": 16})  # reads the drafter's node features
    head.setup(target)
    refs = [ar_generate(target, [p], temperature=0, stop=stop).tokens[0] for p in prompts]
    for sel_name, opts, predictor in (("confidence", {}, pred), ("ecospec", {}, pred),
                                      ("ecospec", {"shared_buffer": True}, pred),
                                      ("goodput", SELECTOR_OPTIONS["goodput"], pred), ("ecospec", {}, head)):
        engine = SpeculativeEngine(target, drafter, selectors.get(sel_name)(**opts), predictor)
        out = engine.generate(prompts[:4], budget=4, steps=3, top_k=2, temperature=0, stop=stop)
        assert out.tokens == refs[:4], (sel_name, opts)
        assert multi_token_share([out]) >= MIN_MULTI, (sel_name, opts)
        # batched AR (left padding, model's own masks) agrees as well
    ar_b = ar_generate(target, prompts[:4], temperature=0, stop=stop)
    assert ar_b.tokens == refs[:4]


def test_predictable_target_still_depends_on_context(make_predictable, arch):
    """The drafter tests' predictable target is no bigram table: on its own greedy continuations the context
    (attention over the cache, masks, positions) decides the token at >= 15 % of positions (measured ~40 %), so
    equality with AR on it still tests the tree masks and caches."""
    target, _ = make_predictable(arch)
    prompts = random_prompts(4, [3, 12, 21, 30], target.vocab_size, seed=2)
    seqs = [p + ar_generate(target, [p], temperature=0, stop=StopRule(MAX_NEW)).tokens[0] for p in prompts]
    shares = [context_share(target, [s], len(p)) for s, p in zip(seqs, prompts)]
    assert sum(shares) / len(shares) >= 0.15, shares


def test_oracle_predictor_keeps_output(make_target):
    target = make_target("gpt_oss")
    drafter, _, prompts, stop = _setup(target, {"share_target": True})
    oracle = predictors.get("oracle")()
    oracle.setup(target)
    engine = SpeculativeEngine(target, drafter, selectors.get("ecospec")(), oracle)
    for p in prompts[:4]:
        ref = ar_generate(target, [p], temperature=0, stop=stop).tokens[0]
        out = engine.generate([p], budget=4, steps=3, top_k=2, temperature=0, stop=stop)
        assert out.tokens[0] == ref
        assert multi_token_share([out]) >= MIN_MULTI
        # with ground-truth expert sets the predicted union of the verified nodes is the activated union
        for s in out.steps:
            assert s.predicted_per_layer == s.experts_per_layer


@pytest.mark.parametrize("fault", ["open", "rootless", "padding", "over_budget"])
def test_selector_error_is_named(make_target, fault):
    from specmoe.decoding.engine import SelectorError
    from specmoe.interfaces.selector import Selector

    class Broken(Selector):
        def select(self, tree, budget, experts=None, buffer=None):
            sel = torch.zeros_like(tree.valid)
            sel[:, 0] = fault != "rootless"
            if fault in ("open", "rootless"):
                sel[:, -1] = True  # a deep leaf without its ancestors
            elif fault == "padding":
                sel[:, 1] = True
                tree.valid[:, 1] = False  # the drafter's node 1 made padding: the selection takes it anyway
            else:
                sel[:] = tree.valid  # the whole pool: more than the budget
            return sel

    target = make_target("qwen3_moe")
    drafter, _, prompts, stop = _setup(target, {"share_target": True})
    engine = SpeculativeEngine(target, drafter, Broken())
    match = {"open": "ancestor-closed", "rootless": "lacks the root", "padding": "padding",
             "over_budget": "more than budget=4"}[fault]
    with pytest.raises(SelectorError, match=f"Broken.*{match}"):
        engine.generate([prompts[0]], budget=4, steps=3, top_k=2, temperature=0, stop=stop)
