# SPDX-License-Identifier: Apache-2.0
"""Greedy speculative decoding equals autoregressive decoding token for token (the first test of any change
to decoding): three architectures x every registered selector x gamma in {2, 4, 6}, 8 prompts, with stop tokens
and max-length cut-offs, batch 1 and batch 4 (there also with the ``draft_head`` predictor on the drafter's node
features); multi-token acceptance is asserted per selector."""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny import random_prompts

from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.stopping import StopRule
from specmoe.registry import drafters, predictors, selectors

MAX_NEW = 18


def _setup(make_target, arch, drafter_opts):
    target = make_target(arch)
    drafter = drafters.get("draft_model")(**drafter_opts)
    drafter.setup(target)
    pred = predictors.get("router_on_embedding")()
    pred.setup(target)
    # GPT-OSS sliding window is 8: most prompts are longer
    prompts = random_prompts(8, [3, 12, 21, 30], target.vocab_size, seed=1)
    free = ar_generate(target, prompts[:1], temperature=0, stop=StopRule(MAX_NEW))
    stop_id = free.tokens[0][6]  # a token the model does produce: exercises stop handling
    return target, drafter, pred, prompts, StopRule(MAX_NEW, stop_ids=[stop_id])


@pytest.mark.parametrize("drafter_opts", [{"share_target": True},
                                          {"tiny": {"arch": "qwen3_moe", "seed": 3, "num_hidden_layers": 1}}],
                         ids=["self_draft", "small_draft"])
def test_greedy_equals_ar_every_selector(make_target, arch, drafter_opts, tmp_path):
    if "tiny" in drafter_opts:
        drafter_opts = {**drafter_opts, "cache_dir": str(tmp_path)}
    target, drafter, pred, prompts, stop = _setup(make_target, arch, drafter_opts)
    refs = [ar_generate(target, [p], temperature=0, stop=stop).tokens[0] for p in prompts]
    assert any(len(r) < MAX_NEW for r in refs), "the stop token should end some outputs early"
    assert any(len(r) == MAX_NEW for r in refs), "some outputs should hit max_new_tokens"
    for sel_name in selectors.names():
        selector = selectors.get(sel_name)()  # goodput: its uncalibrated prior costs (the engine feeds nothing)
        engine = SpeculativeEngine(target, drafter, selector, pred)
        accepted_more_than_one = False
        for gamma in (2, 4, 6):
            for p, ref in zip(prompts, refs):
                out = engine.generate([p], budget=gamma, steps=3, top_k=2, temperature=0, stop=stop)
                assert out.tokens[0] == ref, f"{arch} {sel_name} gamma={gamma} prompt len {len(p)}"
                assert all(len(s.verified) == 1 and s.verified[0] <= gamma for s in out.steps)
                accepted_more_than_one |= any(a > 1 for s in out.steps for a in s.accepted)
        if drafter_opts.get("share_target"):
            assert accepted_more_than_one, f"self-drafting with {sel_name} must accept multi-token paths"


def test_batched_greedy_equals_ar(make_target, arch):
    target, drafter, pred, prompts, stop = _setup(make_target, arch, {"share_target": True})
    head = predictors.get("draft_head")(init={"seed": 0, "rank": 16})  # reads the drafter's node features
    head.setup(target)
    refs = [ar_generate(target, [p], temperature=0, stop=stop).tokens[0] for p in prompts]
    for sel_name, predictor in (("confidence", pred), ("ecospec", pred), ("goodput", pred), ("ecospec", head)):
        engine = SpeculativeEngine(target, drafter, selectors.get(sel_name)(), predictor)
        out = engine.generate(prompts[:4], budget=4, steps=3, top_k=2, temperature=0, stop=stop)
        assert out.tokens == refs[:4], sel_name
        assert any(a > 1 for s in out.steps for a in s.accepted), sel_name
        # batched AR (left padding, model's own masks) agrees as well
    ar_b = ar_generate(target, prompts[:4], temperature=0, stop=stop)
    assert ar_b.tokens == refs[:4]


def test_oracle_predictor_keeps_output(make_target):
    target, drafter, _, prompts, stop = _setup(make_target, "gpt_oss", {"share_target": True})
    oracle = predictors.get("oracle")()
    oracle.setup(target)
    engine = SpeculativeEngine(target, drafter, selectors.get("ecospec")(), oracle)
    for p in prompts[:4]:
        ref = ar_generate(target, [p], temperature=0, stop=stop).tokens[0]
        out = engine.generate([p], budget=4, steps=3, top_k=2, temperature=0, stop=stop)
        assert out.tokens[0] == ref
        # with ground-truth expert sets the predicted union of the verified nodes is the activated union
        for s in out.steps:
            assert s.predicted_per_layer == s.experts_per_layer


def test_selector_error_is_named(make_target):
    from specmoe.decoding.engine import SelectorError
    from specmoe.interfaces.selector import Selector

    class Broken(Selector):
        def select(self, tree, budget, experts=None, buffer=None):
            sel = torch.zeros_like(tree.valid)
            sel[:, 0] = True
            sel[:, -1] = True  # a deep leaf without its ancestors
            return sel

    target, drafter, _, prompts, stop = _setup(make_target, "qwen3_moe", {"share_target": True})
    engine = SpeculativeEngine(target, drafter, Broken())
    with pytest.raises(SelectorError, match="Broken.*ancestor-closed"):
        engine.generate([prompts[0]], budget=4, steps=3, top_k=2, temperature=0, stop=stop)
