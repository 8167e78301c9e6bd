# SPDX-License-Identifier: Apache-2.0
"""Compiled decoding passes (:mod:`specmoe_plugins.targets.hf.graph`, the default with ``torch_union`` on
CPUs): greedy speculative decoding equals autoregressive decoding token for token with every verification and AR
step compiled (GPT-OSS and Qwen3-MoE, float32 and bfloat16, batch 1 and 3, with multi-token acceptance asserted and
the compiled passes counted); a compiled pass computes what the eager lean pass computes (to rounding); the
first-use trial and a failing compiler leave the eager passes in charge. The EAGLE-3 draft's compiled steps and
chain calls: ``test_compiled_draft.py`` (a file of its own, so that the two halves' cold compilations run in
separate test workers)."""

from __future__ import annotations

import logging

import pytest
import torch
from fixtures.agreeing import MIN_MULTI, multi_token_share
from fixtures.compiled import LEAN, MAX_NEW, compiled_target
from fixtures.tiny import random_prompts

from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.stopping import StopRule
from specmoe.registry import drafters, predictors, selectors, verifiers
from specmoe_plugins.targets.hf.graph import GraphDecoder


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", LEAN)
def test_compiled_speculation_equals_compiled_ar(compiled, tiny_cache, agreeing_drafts, arch, dtype):
    target = compiled_target(tiny_cache, arch, dtype)
    graph = target._graph
    assert graph is not None
    drafter = drafters.get("eagle3")(path=str(agreeing_drafts(arch, "eagle3")))
    drafter.setup(target)
    pred = predictors.get("router_on_embedding")()
    pred.setup(target)
    assert graph.state == "ready", graph.reason  # compiled and tried when the verifier was installed
    prompts = random_prompts(3, [2, 11, 29], target.vocab_size, seed=4)
    free = ar_generate(target, prompts[:1], temperature=0, stop=StopRule(MAX_NEW))
    stop = StopRule(MAX_NEW, stop_ids=[free.tokens[0][5]])
    refs = [ar_generate(target, [p], temperature=0, stop=stop).tokens[0] for p in prompts]
    ar_passes = graph.passes
    assert ar_passes >= sum(len(r) for r in refs) - len(refs), "the AR steps ran compiled"
    gens = []
    for sel_name in ("confidence", "ecospec"):
        engine = SpeculativeEngine(target, drafter, selectors.get(sel_name)(), pred)
        for gamma in (2, 4):
            for p, ref in zip(prompts, refs):
                out = engine.generate([p], budget=gamma, steps=3, top_k=2, temperature=0, stop=stop)
                assert out.tokens[0] == ref, f"{arch} {dtype} {sel_name} gamma={gamma} len {len(p)}"
                gens.append(out)
        out = engine.generate(prompts, budget=4, steps=3, top_k=2, temperature=0, stop=stop)
        assert out.tokens == refs, f"{arch} {dtype} {sel_name} batch of 3"
        gens.append(out)
    assert graph.passes > ar_passes + sum(len(g.steps) for g in gens) // 2, "the verification passes ran compiled"
    assert graph.state == "ready"
    share = multi_token_share(gens)
    assert share >= MIN_MULTI, f"{arch} {dtype}: only {share:.2f} of steps accepted a draft"


@pytest.mark.parametrize("arch", LEAN)
def test_compiled_pass_computes_the_eager_pass(compiled, tiny_cache, arch):
    """The same passes (a prompt, then one token, then a 3-node tree) through the compiled and the eager path:
    logits within float32 rounding, the same routing, the same hidden states to rounding."""
    fast, slow = compiled_target(tiny_cache, arch), compiled_target(tiny_cache, arch, compile_=False)
    assert fast._graph is not None and slow._graph is None
    assert fast._graph.state == "ready" and fast._graph.passes == 1, "compiled (and tried) when installed"
    prompt = torch.tensor([random_prompts(1, [13], fast.vocab_size, seed=2)[0]])
    outs = {}
    for name, target in (("fast", fast), ("slow", slow)):
        kv = target.new_kv(1, capacity=32)
        pos = torch.arange(13)[None]
        first = target.forward(prompt, kv, pos, capture_routing=True)
        step = target.forward(prompt[:, -1:], kv, torch.tensor([[13]]), capture_routing=True, hidden_layers=[1, -1])
        tree = torch.tensor([[True, False, False], [True, True, False], [True, False, True]])[None]
        nodes = target.forward(prompt[:, :3], kv, torch.tensor([[14, 15, 15]]), tree, capture_routing=True,
                               hidden_layers=[0, 2])
        outs[name] = (first, step, nodes)
    assert fast._graph.passes == 3
    for a, b in zip(outs["fast"], outs["slow"]):
        scale = float(b.logits.abs().max())
        assert float((a.logits - b.logits).abs().max()) <= 1e-4 * scale
        assert torch.equal(a.routing, b.routing)
        if b.hidden is not None:
            assert torch.allclose(a.hidden, b.hidden, rtol=1e-4, atol=1e-4 * float(b.hidden.abs().max()))


def _ar(target, prompts):
    return [ar_generate(target, [p], temperature=0, stop=StopRule(8)).tokens[0] for p in prompts]


def test_a_row_that_differs_beside_others_turns_compiling_off(compiled, tiny_cache, monkeypatch, caplog):
    """The first-use trial compares each row of a multi-row pass with the row alone; where they differ the
    target keeps its eager passes (and says so), with the eager output."""
    run = GraphDecoder._run

    def uneven(self, input_ids, *args):  # a pass of several tokens rounds its rows differently
        h, states, routing, logits = run(self, input_ids, *args)
        return h, states, routing, logits + (1e-6 if input_ids.shape[1] > 1 else 0.0)

    monkeypatch.setattr(GraphDecoder, "_run", uneven)
    with caplog.at_level(logging.WARNING, logger="specmoe_plugins.targets.hf.graph"):
        target = compiled_target(tiny_cache, "gpt_oss")  # the trial runs when the verifier is installed
        prompts = random_prompts(2, [5, 9], target.vocab_size, seed=3)
        got = _ar(target, prompts)
    assert target._graph.state == "off" and target._graph.passes == 0
    assert "differs from the same row alone" in caplog.text
    assert got == _ar(compiled_target(tiny_cache, "gpt_oss", compile_=False), prompts)


def test_a_compiler_failure_keeps_the_eager_passes(compiled, tiny_cache, monkeypatch, caplog):
    import specmoe_plugins.targets.hf.graph as graph_module

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(graph_module, "compile_fn", lambda fn: broken)
    with caplog.at_level(logging.WARNING, logger="specmoe_plugins.targets.hf.graph"):
        target = compiled_target(tiny_cache, "qwen3_moe")
        prompts = random_prompts(2, [5, 9], target.vocab_size, seed=3)
        got = _ar(target, prompts)
    assert target._graph.state == "off" and "no C++ compiler" in target._graph.reason
    assert "compiling failed" in caplog.text
    assert got == _ar(compiled_target(tiny_cache, "qwen3_moe", compile_=False), prompts)


def test_switched_off_by_the_environment_and_by_the_verifier(tiny_cache, monkeypatch):
    monkeypatch.setenv("SPECMOE_COMPILE", "0")
    assert compiled_target(tiny_cache, "gpt_oss")._graph is None
    monkeypatch.setenv("SPECMOE_COMPILE", "1")
    assert compiled_target(tiny_cache, "gpt_oss", compile_=False)._graph is None
    target = compiled_target(tiny_cache, "gpt_oss")
    assert target._graph is not None
    verifiers.get("hf")().install(target)  # the model's own experts code: every pass eager
    assert target._graph is None


def test_standard_gives_a_new_tensor_for_a_view():
    """A compiled function guards on a view's base: :func:`specmoe.models.compiling.standard` copies views
    (contiguous ones included) and passes a tensor of its own through."""
    from specmoe.models.compiling import standard

    m = torch.arange(6).view(2, 3)
    own = torch.arange(6)
    v = standard(m[None])
    assert v._base is None and torch.equal(v, m[None])
    assert standard(own) is own


def test_deepseek_v3_keeps_the_eager_passes_and_stays_lossless_with_compiling_on(compiled, tiny_cache,
                                                                                   agreeing_drafts):
    """DeepSeek-V3's MLP holds shared experts beside the router and the routed experts, so no compiled pass is
    built for it (logged); with compiling on (the default), greedy speculation still equals AR token for token,
    with multi-token acceptance, and the EAGLE-3 draft's compiled step serves it."""
    target = compiled_target(tiny_cache, "deepseek_v3")
    assert target._graph is None
    drafter = drafters.get("eagle3")(path=str(agreeing_drafts("deepseek_v3", "eagle3")))
    drafter.setup(target)
    assert drafter.model.__dict__["_compiled_step"] is not None
    prompts = random_prompts(2, [3, 17], target.vocab_size, seed=5)
    stop = StopRule(MAX_NEW)
    refs = [ar_generate(target, [p], temperature=0, stop=stop).tokens[0] for p in prompts]
    engine = SpeculativeEngine(target, drafter, selectors.get("confidence")(), None)
    gens = [engine.generate([p], budget=4, steps=3, top_k=2, temperature=0, stop=stop) for p in prompts]
    assert [g.tokens[0] for g in gens] == refs
    assert multi_token_share(gens) >= MIN_MULTI
    assert not drafter.model.__dict__["_compiled_step"].off


@pytest.mark.parametrize("arch", LEAN)
def test_compiled_passes_read_changed_weights_and_compile_nothing_after_the_trial(compiled, tiny_cache, arch):
    """The compiled pass keeps its weight list (and the experts' graph weights) between passes and reads them
    again when they change: a replaced LM head and experts updated in place (GPT-OSS's are a de-interleaved copy)
    give what the eager pass gives with the same change; and after the first-use trial the passes (marked
    dynamic only while a variant may compile) compile nothing more."""
    from torch._dynamo.utils import counters

    fast, slow = compiled_target(tiny_cache, arch), compiled_target(tiny_cache, arch, compile_=False)
    assert fast._graph is not None and fast._graph.state == "ready"
    compiled_before = counters["stats"]["unique_graphs"]
    prompt = torch.tensor([random_prompts(1, [13], fast.vocab_size, seed=5)[0]])

    def passes(target):
        kv = target.new_kv(1, capacity=32)
        target.forward(prompt, kv, torch.arange(13)[None], capture_routing=True)
        one = target.forward(prompt[:, -1:], kv, torch.tensor([[13]]), capture_routing=True)
        tree = torch.tensor([[True, False, False], [True, True, False], [True, False, True]])[None]
        three = target.forward(prompt[:, :3], kv, torch.tensor([[14, 15, 15]]), tree, capture_routing=True)
        return one, three

    def close(a, b):
        for x, y in zip(a, b):
            assert float((x.logits - y.logits).abs().max()) <= 1e-4 * float(y.logits.abs().max())
            assert torch.equal(x.routing, y.routing)

    before = passes(fast)
    close(before, passes(slow))
    for target in (fast, slow):
        head = target.model.get_output_embeddings()
        head.weight = torch.nn.Parameter(head.weight.detach() * 1.5, requires_grad=False)
        experts = target.model.model.layers[0].mlp.experts
        with torch.no_grad():
            experts.down_proj.mul_(-2.0)
    after = passes(fast)
    close(after, passes(slow))
    assert not torch.allclose(after[0].logits, before[0].logits), "the changed weights were read"
    assert fast._graph.passes >= 4 and fast._graph.state == "ready"
    assert counters["stats"]["unique_graphs"] == compiled_before


def test_a_router_hook_added_after_the_pass_was_built_runs_the_pass_eagerly(compiled, tiny_cache):
    """Forced routing through router forward hooks (``bench expert_latency``'s ``override_routers``) added after
    the compiled pass was traced: the graph would not see the hook, so the pass runs eagerly and routes as
    forced; with the hooks removed the passes are compiled again."""
    from specmoe_plugins.selectors.goodput.expert_latency import forced_routing, override_routers

    target = compiled_target(tiny_cache, "gpt_oss")
    graph = target._graph
    assert graph is not None and graph.state == "ready"
    kv = target.new_kv(1, capacity=40)
    ids = torch.tensor([random_prompts(1, [12], target.vocab_size, seed=7)[0]])
    target.forward(ids, kv, torch.arange(12)[None])
    gen = torch.Generator().manual_seed(0)
    forced = [forced_routing(3, target.top_k, target.top_k + 1, target.num_experts, gen) for _ in target.routers()]
    hooks = override_routers(target.routers(), forced)
    passes = graph.passes
    out = target.forward(ids[:, :3], kv, torch.arange(12, 15)[None], capture_routing=True)
    assert graph.passes == passes, "ran eagerly"
    for layer, (index, _) in enumerate(forced):
        assert torch.equal(out.routing[0, :, layer].sort(-1).values, index.sort(-1).values)
    for h in hooks:
        h.remove()
    target.forward(ids[:, :2], kv, torch.arange(15, 17)[None], capture_routing=True)
    assert graph.passes == passes + 1, "compiled again"
