# SPDX-License-Identifier: Apache-2.0
"""EAGLE-3 / GTO drafting: greedy speculative decoding equals autoregressive decoding on the three tiny
architectures with drafts that agree with the target (multi-token acceptance asserted; EcoSpec with the
``draft_head`` predictor on the draft's node features), and the draft's
incremental inference computes exactly what training unrolls."""

from __future__ import annotations

import pytest
import torch
from fixtures.agreeing import MIN_MULTI, multi_token_share
from fixtures.tiny import random_prompts

from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.stopping import StopRule
from specmoe.interfaces.drafter import Committed
from specmoe.registry import drafters, predictors, selectors
from specmoe_plugins.drafters.eagle3.model import Eagle3Config, Eagle3Model
from specmoe_plugins.drafters.eagle3.ttt import ttt_unroll

MAX_NEW = 16


@pytest.mark.parametrize("drafter_name", ["eagle3", "gto"])
def test_greedy_equals_ar(make_predictable, agreeing_drafts, arch, drafter_name):
    """Every selector, gamma 2/4/6, batch 1 and 3, on the predictable target with a draft built from its
    weights (``fixtures/agreeing.py``): output == AR, and at least :data:`MIN_MULTI` of the steps of every
    selector append two or more tokens (so acceptance, KV pruning and feature hand-over of accepted paths run)."""
    target, _ = make_predictable(arch)
    drafter = drafters.get(drafter_name)(path=str(agreeing_drafts(arch, "eagle3")))
    drafter.setup(target)
    pred = predictors.get("router_on_embedding")()
    pred.setup(target)
    head = predictors.get("draft_head")(init={"seed": 0, "rank": 16})  # on the draft's node features
    head.setup(target)
    prompts = random_prompts(3, [2, 11, 29], target.vocab_size, seed=4)  # tiny GPT-OSS window is 8
    free = ar_generate(target, prompts[:1], temperature=0, stop=StopRule(MAX_NEW))
    stop = StopRule(MAX_NEW, stop_ids=[free.tokens[0][5]])
    refs = [ar_generate(target, [p], temperature=0, stop=stop).tokens[0] for p in prompts]
    assert any(len(r) < MAX_NEW for r in refs)
    for sel_name in ("confidence", "ecospec", "global_cost"):
        engine = SpeculativeEngine(target, drafter, selectors.get(sel_name)(), head if sel_name == "ecospec" else pred)
        gens = []
        for gamma in (2, 4, 6):
            for p, ref in zip(prompts, refs):
                out = engine.generate([p], budget=gamma, steps=3, top_k=2, temperature=0, stop=stop)
                assert out.tokens[0] == ref, f"{arch} {drafter_name} {sel_name} gamma={gamma} len {len(p)}"
                gens.append(out)
        out = engine.generate(prompts, budget=4, steps=3, top_k=2, temperature=0, stop=stop)
        assert out.tokens == refs, f"{arch} {drafter_name} {sel_name} batch"
        share = multi_token_share(gens + [out])
        assert share >= MIN_MULTI, f"{arch} {drafter_name} {sel_name}: {share:.2f} of steps accepted a draft"


def _tiny_draft(seed: int = 0) -> Eagle3Model:
    torch.manual_seed(seed)
    c = Eagle3Config(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                     vocab_size=60, draft_vocab_size=60)
    m = Eagle3Model(c).double().eval()
    for p in m.parameters():
        p.data.normal_(0, 0.3)
    return m


def test_ttt_unroll_matches_incremental_inference():
    """TTT step j at index i == the depth-j node on the data path, drafted with a KV cache."""
    m = _tiny_draft()
    bsz, length, steps = 2, 9, 4
    ids = torch.randint(0, 60, (bsz, length))
    feats = torch.randn(bsz, length, 96, dtype=torch.double)
    valid = torch.ones(bsz, length, dtype=torch.bool)
    valid[1, 6:] = False
    out = ttt_unroll(m, ids, feats, valid, steps)
    with torch.no_grad():
        for b in range(bsz):
            for i in range(length - 2):
                if not valid[b, i + 1]:
                    continue
                n = i + 1
                allowed = torch.ones(n, n, dtype=torch.bool).tril()[None]
                h, k, v = m.step(ids[b:b + 1, 1:n + 1], m.project(feats[b:b + 1, :n]), torch.arange(n)[None],
                                 None, None, allowed)
                h = h[:, -1:]
                torch.testing.assert_close(m.logits(h)[0, 0], out.logits[0][b, i])
                for j in range(1, steps):
                    t = i + 1 + j
                    if t >= length or not valid[b, t]:
                        break
                    s = k.shape[2]
                    h, nk, nv = m.step(ids[b:b + 1, t:t + 1], h, torch.tensor([[i + j]]), k, v,
                                       torch.ones(1, 1, s + 1, dtype=torch.bool))
                    k, v = torch.cat([k, nk], 2), torch.cat([v, nv], 2)
                    torch.testing.assert_close(m.logits(h)[0, 0], out.logits[j][b, i])


def test_draft_cache_absorbs_rounds_like_one_pass(make_target):
    """Committing tokens over several rounds leaves the same root distribution as one prompt pass."""
    target = make_target("qwen3_moe")
    drafter = drafters.get("eagle3")(init={"seed": 2, "draft_vocab_size": 100}, dtype="float32")
    drafter.setup(target)
    seq = random_prompts(1, [14], target.vocab_size, seed=9)[0]
    kv = target.new_kv(1)
    ids = torch.tensor([seq])
    out = target.forward(ids, kv, torch.arange(len(seq))[None], hidden_layers=drafter.feature_layers)
    feats = torch.zeros(1, len(seq), out.hidden.shape[-1])
    feats[:, 1:] = out.hidden[:, :-1]

    def committed(lo, hi, first):
        pos = torch.arange(lo, hi)[None]
        return Committed(ids[:, lo:hi], torch.ones(1, hi - lo, dtype=torch.bool), pos, feats[:, lo:hi], first)

    one = drafter.begin(1)
    tree_one = drafter.draft(one, committed(0, len(seq), True), 3, 2)
    rounds = drafter.begin(1)
    for lo, hi in ((0, 5), (5, 6), (6, 11), (11, len(seq))):
        tree_rounds = drafter.draft(rounds, committed(lo, hi, lo == 0), 3, 2)
    torch.testing.assert_close(rounds.root_logp, one.root_logp, rtol=1e-5, atol=1e-5)
    assert torch.equal(tree_rounds.tokens, tree_one.tokens)
    assert torch.equal(tree_rounds.parents, tree_one.parents)
    assert rounds.k.shape[2] == len(seq)  # only committed context is cached; tree slots were dropped


def test_a_step_records_what_its_verification_accepted_before_the_stop_rule_cut(make_predictable,
                                                                              agreeing_drafts):
    """``StepRecord.uncut`` is what the acceptance produced (drafts + bonus), ``accepted`` what the stop rule
    kept: equal on every step but a cut last one, where the token limit falls inside an accepted path (what
    vLLM's acceptance counters count, so ``bench tree`` / ``bench peer`` compare tokens per step alike)."""
    target, _ = make_predictable("gpt_oss")
    drafter = drafters.get("eagle3")(path=str(agreeing_drafts("gpt_oss", "eagle3")))
    drafter.setup(target)
    engine = SpeculativeEngine(target, drafter, selectors.get("confidence")(), None)
    prompts = random_prompts(6, [3, 5, 7, 9, 11, 13], target.vocab_size, seed=6)
    cut = 0
    for limit in (5, 6, 7):
        for p in prompts:
            out = engine.generate([p], budget=5, steps=4, top_k=1, temperature=0, stop=StopRule(limit))
            assert 1 + sum(s.accepted[0] for s in out.steps) == len(out.tokens[0]) <= limit  # 1: the prompt pass
            for s in out.steps[:-1]:
                assert s.uncut == s.accepted
            last = out.steps[-1]
            assert last.uncut[0] >= last.accepted[0]
            cut += last.uncut[0] > last.accepted[0]
    assert cut > 0, "some generation's limit fell inside an accepted path"
