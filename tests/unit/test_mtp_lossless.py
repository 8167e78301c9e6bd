# SPDX-License-Identifier: Apache-2.0
"""The ``mtp`` drafter: greedy speculative decoding equals autoregressive decoding on the three tiny
architectures (confidence, ecospec and global_cost + router_on_embedding, gamma 2/4/6, prompts longer than
GPT-OSS's sliding window, stop tokens, batch 1 and 4) with heads built from the predictable target's
weights, so that at least 30 % of the steps accept a draft token (asserted); and every draft-tree node's
probability equals a from-scratch recomputation of a random head over the explicit root-to-node chain (masks,
positions, KV slots and recursion)."""

from __future__ import annotations

import pytest
import torch
from fixtures.agreeing import MIN_MULTI, multi_token_share
from fixtures.tiny import random_prompts

from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.stopping import StopRule
from specmoe.interfaces.drafter import Committed
from specmoe.interfaces.kv import additive_mask
from specmoe.registry import drafters, predictors, selectors
from specmoe_plugins.drafters.mtp.checkpoint import export_head
from specmoe_plugins.drafters.mtp.model import MTPSpec, build_head

MAX_NEW = 16


@pytest.fixture(scope="module")
def head_dirs(tmp_path_factory):
    """``head_dir(target, mlp)`` -> directory of a randomly initialised exported head (cached)."""
    made = {}

    def get(target, mlp="dense", recurse="normed"):
        key = (id(target), mlp, recurse)
        if key not in made:
            torch.manual_seed(7)
            head = build_head(target.parts(), MTPSpec(mlp=mlp, recurse=recurse),
                              device="cpu", dtype=torch.float32)
            made[key] = export_head(head, target.parts(), tmp_path_factory.mktemp("mtp_head"))
        return made[key]

    return get


def _setup(make_predictable, agreeing_drafts, arch, mlp="dense"):
    target, _ = make_predictable(arch)
    drafter = drafters.get("mtp")(path=str(agreeing_drafts(arch, f"mtp_{mlp}")))
    drafter.setup(target)
    pred = predictors.get("router_on_embedding")()
    pred.setup(target)
    prompts = random_prompts(4, [3, 12, 21, 30], target.vocab_size, seed=2)  # GPT-OSS window is 8
    free = ar_generate(target, prompts[:1], temperature=0, stop=StopRule(MAX_NEW))
    stop = StopRule(MAX_NEW, stop_ids=[free.tokens[0][5]])
    return target, drafter, pred, prompts, stop


def test_greedy_equals_ar(make_predictable, agreeing_drafts, arch):
    target, drafter, pred, prompts, stop = _setup(make_predictable, agreeing_drafts, arch)
    refs = [ar_generate(target, [p], temperature=0, stop=stop).tokens[0] for p in prompts]
    assert any(len(r) < MAX_NEW for r in refs) and any(len(r) == MAX_NEW for r in refs)
    for sel_name in ("confidence", "ecospec", "global_cost"):
        engine = SpeculativeEngine(target, drafter, selectors.get(sel_name)(), pred)
        gens = []
        for gamma in (2, 4, 6):
            for p, ref in zip(prompts, refs):
                out = engine.generate([p], budget=gamma, steps=3, top_k=2, temperature=0, stop=stop)
                assert out.tokens[0] == ref, f"{arch} {sel_name} gamma={gamma} prompt len {len(p)}"
                assert all(s.verified[0] <= gamma for s in out.steps)
                gens.append(out)
        share = multi_token_share(gens)
        assert share >= MIN_MULTI, f"{arch} {sel_name}: only {share:.2f} of steps accepted a draft token"


@pytest.mark.parametrize("mlp", ["dense", "moe"])
def test_batched_greedy_equals_ar(make_predictable, agreeing_drafts, arch, mlp):
    target, drafter, pred, prompts, stop = _setup(make_predictable, agreeing_drafts, arch, mlp)
    refs = [ar_generate(target, [p], temperature=0, stop=stop).tokens[0] for p in prompts]
    head = predictors.get("draft_head")(init={"seed": 0, "rank": 16})  # on the head's node features
    head.setup(target)
    for predictor in (pred, head):
        engine = SpeculativeEngine(target, drafter, selectors.get("ecospec")(), predictor)
        out = engine.generate(prompts, budget=4, steps=3, top_k=2, temperature=0, stop=stop)
        assert out.tokens == refs
        assert multi_token_share([out]) >= MIN_MULTI


def _full_recompute_logp(head, target, committed_ids, feats, chain):
    """log q(. | chain) by running the head over [committed slots, chain slots] without any cache."""
    ids = committed_ids[1:]  # token q enters the slot at position q - 1 with the hidden state of q - 1
    hidden = feats[1:]
    for tok in chain:
        n = ids.shape[0]
        pos = torch.arange(n)[None]
        mask = additive_mask(torch.ones(n, n, dtype=torch.bool).tril()[None, None], torch.float32)
        o = head(ids[None], hidden[None], pos, mask)[0, -1]
        ids = torch.cat([ids, torch.tensor([tok])])
        hidden = torch.cat([hidden, head.recurse(o)[None]])
    n = ids.shape[0]
    mask = additive_mask(torch.ones(n, n, dtype=torch.bool).tril()[None, None], torch.float32)
    o = head(ids[None], hidden[None], torch.arange(n)[None], mask)[0, -1]
    return torch.log_softmax(head.logits(o).float(), dim=-1)


@pytest.mark.parametrize("recurse", ["normed", "block"])
def test_tree_logp_matches_full_recompute(make_target, head_dirs, arch, recurse):
    target = make_target(arch)
    drafter = drafters.get("mtp")(path=str(head_dirs(target, "dense", recurse)))
    drafter.setup(target)
    prompt = random_prompts(1, [11], target.vocab_size, seed=4)[0]
    kv = target.new_kv(1)
    ids = torch.tensor([prompt])
    out = target.forward(ids, kv, torch.arange(len(prompt))[None], hidden_layers=[-1])
    root = int(out.logits[0, -1].argmax())
    c_ids = torch.tensor([prompt + [root]])
    feats = torch.zeros(1, c_ids.shape[1], out.hidden.shape[-1])
    feats[:, 1:] = out.hidden
    state = drafter.begin(1)
    # commit in two calls (prompt part, then the rest) to exercise the incremental cache as well
    cut = 6
    pos = torch.arange(c_ids.shape[1])[None]
    drafter.draft(state, Committed(c_ids[:, :cut], torch.ones(1, cut, dtype=torch.bool), pos[:, :cut],
                                   feats[:, :cut], first=True), 2, 2)
    rest = c_ids.shape[1] - cut
    tree = drafter.draft(state, Committed(c_ids[:, cut:], torch.ones(1, rest, dtype=torch.bool), pos[:, cut:],
                                          feats[:, cut:]), steps=3, top_k=2)
    assert tree.num_nodes == 1 + 2 + 2 * 4
    par, toks = tree.parents[0].tolist(), tree.tokens[0].tolist()
    with torch.no_grad():
        for i in range(1, tree.num_nodes):
            chain, j = [], par[i]
            while j > 0:
                chain.append(toks[j])
                j = par[j]
            want = _full_recompute_logp(drafter.head, target, c_ids[0], feats[0], chain[::-1])
            assert abs(float(tree.logp[0, i]) - float(want[toks[i]])) < 1e-4, f"{arch} node {i}"
