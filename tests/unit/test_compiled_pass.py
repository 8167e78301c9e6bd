# SPDX-License-Identifier: Apache-2.0
"""Compiled decoding passes (:mod:`specmoe.models.graph`, the default with ``torch_union`` on CPUs): greedy
speculative decoding equals autoregressive decoding token for token with every verification and AR step
compiled (GPT-OSS and Qwen3-MoE, float32 and bfloat16, batch 1 and 3, with multi-token acceptance asserted and
the compiled passes counted); a compiled pass computes what the eager lean pass computes (to rounding); the
first-use trial and a failing compiler leave the eager passes in charge."""

from __future__ import annotations

import logging

import pytest
import torch
from fixtures.agreeing import MIN_MULTI, multi_token_share, predictable_checkpoint
from fixtures.tiny import random_prompts

from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.stopping import StopRule
from specmoe.models.graph import GraphDecoder
from specmoe.registry import drafters, predictors, selectors, targets, verifiers

LEAN = ["gpt_oss", "qwen3_moe"]
MAX_NEW = 16


def _target(tiny_cache, arch: str, dtype: str = "float32", compile_: bool = True):
    """A fresh predictable target (its own compiled pass) with ``torch_union`` installed."""
    ckpt = predictable_checkpoint(arch, tiny_cache)
    target = targets.get("hf")(path=str(ckpt), dtype=dtype)
    verifiers.get("torch_union")(compile=compile_).install(target)
    return target


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", LEAN)
def test_compiled_speculation_equals_compiled_ar(compiled, tiny_cache, agreeing_drafts, arch, dtype):
    target = _target(tiny_cache, arch, dtype)
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
    fast, slow = _target(tiny_cache, arch), _target(tiny_cache, arch, compile_=False)
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
    with caplog.at_level(logging.WARNING, logger="specmoe.models.graph"):
        target = _target(tiny_cache, "gpt_oss")  # the trial runs when the verifier is installed
        prompts = random_prompts(2, [5, 9], target.vocab_size, seed=3)
        got = _ar(target, prompts)
    assert target._graph.state == "off" and target._graph.passes == 0
    assert "differs from the same row alone" in caplog.text
    assert got == _ar(_target(tiny_cache, "gpt_oss", compile_=False), prompts)


def test_a_compiler_failure_keeps_the_eager_passes(compiled, tiny_cache, monkeypatch, caplog):
    import specmoe.models.graph as graph_module

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(graph_module, "compile_fn", lambda fn: broken)
    with caplog.at_level(logging.WARNING, logger="specmoe.models.graph"):
        target = _target(tiny_cache, "qwen3_moe")
        prompts = random_prompts(2, [5, 9], target.vocab_size, seed=3)
        got = _ar(target, prompts)
    assert target._graph.state == "off" and "no C++ compiler" in target._graph.reason
    assert "compiling failed" in caplog.text
    assert got == _ar(_target(tiny_cache, "qwen3_moe", compile_=False), prompts)


def test_switched_off_by_the_environment_and_by_the_verifier(tiny_cache, monkeypatch):
    monkeypatch.setenv("SPECMOE_COMPILE", "0")
    assert _target(tiny_cache, "gpt_oss")._graph is None
    monkeypatch.setenv("SPECMOE_COMPILE", "1")
    assert _target(tiny_cache, "gpt_oss", compile_=False)._graph is None
    target = _target(tiny_cache, "gpt_oss")
    assert target._graph is not None
    verifiers.get("hf")().install(target)  # the model's own experts code: every pass eager
    assert target._graph is None


def _small_draft():
    """A small EAGLE-3 draft (hidden 32, draft vocabulary 40 of 60) with weights of std 0.3 (seed 0)."""
    from specmoe_plugins.drafters.eagle3.model import Eagle3Config, Eagle3Model

    c = Eagle3Config(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                     vocab_size=60, draft_vocab_size=40)
    torch.manual_seed(0)
    m = Eagle3Model(c).eval().requires_grad_(False)
    for p in m.parameters():
        p.data.normal_(0, 0.3)
    return m


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_draft_step_computes_the_eager_step(compiled, monkeypatch, dtype):
    """The EAGLE-3 draft's compiled step (:mod:`specmoe_plugins.drafters.eagle3.compiled`) against its eager
    step over the same cache: one input, then three inputs attending to the first and to their own prefix (in
    bf16 the several-input variant takes BLAS products: the same to bf16 rounding)."""
    from specmoe_plugins.drafters.eagle3.model import Eagle3Config, Eagle3Model

    torch.manual_seed(0)
    c = Eagle3Config(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                     vocab_size=60, draft_vocab_size=40)
    models = {}
    for name, env in (("compiled", "1"), ("eager", "0")):
        monkeypatch.setenv("SPECMOE_COMPILE", env)
        torch.manual_seed(0)
        m = Eagle3Model(c).eval().requires_grad_(False)
        for p in m.parameters():
            p.data.normal_(0, 0.3)
        m.to(dtype)
        m.step_logp(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, 32, dtype=dtype),
                    torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 2, 8, 8, dtype=dtype),
                    torch.zeros(1, 2, 8, 8, dtype=dtype), 0, torch.ones(1, 1, 1, dtype=torch.bool))
        models[name] = m
    assert models["compiled"].__dict__["_compiled_step"] is not None
    assert models["eager"].__dict__["_compiled_step"] is None
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 60, (2, 4), generator=g)
    hidden = torch.randn(2, 4, 32, generator=g).to(dtype)
    results = {}
    with torch.no_grad():
        for name, m in models.items():
            k, v = torch.zeros(2, 2, 16, 8, dtype=dtype), torch.zeros(2, 2, 16, 8, dtype=dtype)
            first = m.step_logp(tokens[:, :1], hidden[:, :1], torch.zeros(2, 1, dtype=torch.long), k, v, 0,
                                torch.ones(2, 1, 1, dtype=torch.bool))
            allowed = torch.ones(2, 3, 4, dtype=torch.bool).tril(1)
            rest = m.step_logp(tokens[:, 1:], hidden[:, 1:], torch.tensor([[1, 2, 3]] * 2), k, v, 1, allowed)
            results[name] = (*first, *rest, k[:, :, :4], v[:, :, :4])
    tol = 1e-4 if dtype == torch.float32 else 2e-2  # bf16: products rounded at other points (~0.7 % seen)
    for a, b in zip(results["compiled"], results["eager"]):
        assert a.dtype == b.dtype
        assert torch.allclose(a.float(), b.float(), rtol=tol, atol=tol * float(b.float().abs().max()))
    assert not models["compiled"].__dict__["_compiled_step"].off


def test_a_draft_step_over_more_inputs_than_compiled_max_rows_runs_eagerly(compiled, monkeypatch):
    """A prompt's or a long catch-up's draft step (``B * N`` above the compiled step's ``max_rows``:
    ``ROW_KERNEL_ROWS`` with the row kernels, else ``COMPILED_MAX_ROWS`` in float32) takes the eager step
    (BLAS products read each weight once for all rows); up to it the compiled step runs; both give the same
    log-probabilities to rounding."""
    from specmoe_plugins.drafters.eagle3 import compiled as compiled_mod

    m = _small_draft()
    calls = []
    real = compiled_mod.CompiledStep.__call__
    monkeypatch.setattr(compiled_mod.CompiledStep, "__call__",
                        lambda self, tokens, *a: calls.append(tokens.numel()) or real(self, tokens, *a))
    step = compiled_mod.CompiledStep.build(m)
    assert step.max_rows == (compiled_mod.ROW_KERNEL_ROWS if step.row else compiled_mod.COMPILED_MAX_ROWS)
    n = step.max_rows + 1
    g = torch.Generator().manual_seed(2)
    tokens, hidden = torch.randint(0, 60, (1, n), generator=g), torch.randn(1, n, 32, generator=g)
    allowed = torch.ones(n, n, dtype=torch.bool).tril()[None]
    with torch.no_grad():
        out = {}
        for rows in (n, n - 1):  # the first runs eagerly, the second (max_rows inputs) compiled
            k, v = torch.zeros(1, 2, n + 1, 8), torch.zeros(1, 2, n + 1, 8)
            out[rows] = m.step_logp(tokens[:, :rows], hidden[:, :rows], torch.arange(rows)[None], k, v, 0,
                                    allowed[:, :rows, :rows])[1]
    assert calls == [n - 1]
    assert m.__dict__["_compiled_step"] is not None and not m.__dict__["_compiled_step"].off
    assert torch.allclose(out[n][:, :n - 1], out[n - 1], rtol=1e-4, atol=1e-5)


def test_the_draft_steps_a_decoding_run_takes_do_not_compile_after_warm_up(compiled):
    """``Eagle3Model.warm_up`` compiles the variants real drafting takes: after it, a chain's one-input step over
    a long cache and absorbing several accepted tokens (fresh tensors, as the drafter passes them) compile
    nothing more (a warm-up that attended to a single slot through a view left a variant no real step matched:
    0.3-1 s of compiling inside the first timed generations)."""
    from torch._dynamo.utils import counters

    from specmoe_plugins.drafters.eagle3.model import Eagle3Config, Eagle3Model

    c = Eagle3Config(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                     vocab_size=60, draft_vocab_size=40)
    torch.manual_seed(0)
    m = Eagle3Model(c).eval().requires_grad_(False)
    m.warm_up()
    step = m.__dict__["_compiled_step"]
    assert step is not None and not step.off
    compiled_before = counters["stats"]["unique_graphs"]
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for start, n in ((40, 1), (41, 1), (42, 2), (44, 5), (49, 1), (50, 3)):
            k, v = torch.zeros(1, 2, 64, 8), torch.zeros(1, 2, 64, 8)
            allowed = torch.ones(1, n, start + n, dtype=torch.bool)
            m.step_logp(torch.randint(0, 60, (1, n), generator=g), torch.randn(1, n, 32, generator=g),
                        torch.arange(start, start + n)[None], k, v, start, allowed)
    assert counters["stats"]["unique_graphs"] == compiled_before
    assert not step.off


@pytest.mark.parametrize(("dtype", "bsz", "top_k"), [(torch.float32, 1, 1), (torch.float32, 3, 2),
                                                      (torch.float32, 1, 3)])
def test_a_chain_drafted_in_one_compiled_call_is_the_pool_built_level_by_level(compiled, monkeypatch, dtype, bsz,
                                                                               top_k):
    """A pool of frontier width one (a chain, ``top_k = 1``, or a chain with each level's runner-ups) is drafted by
    one compiled call (``Eagle3Model.chain_logp``) where the compiled step runs: the same tree as
    :func:`build_pool` level by level (tokens, structure, features; edge log-probabilities to rounding), the same
    keys / values written after the context, the context's length unchanged, and no level-by-level step taken.
    Float32 only: in bf16 the two graphs round at different points (~1e-2) and may order near-equal candidates
    differently (any order is a valid draft); bf16 chains are held to AR in test_compiled_chains_equal_compiled_ar."""
    from specmoe_plugins.drafters.eagle3 import compiled as compiled_mod
    from specmoe_plugins.drafters.eagle3.tree import TreeContext, draft_pool

    m = _small_draft()
    m.d2t.copy_(torch.randint(0, 20, (40,)))  # draft ids map to other target ids
    m.to(dtype)
    steps, n_ctx = 4, 7
    g = torch.Generator().manual_seed(5)
    k0, v0 = torch.randn(bsz, 2, n_ctx + 8, 8, generator=g).to(dtype), torch.randn(bsz, 2, n_ctx + 8, 8,
                                                                                  generator=g).to(dtype)
    seen = torch.rand(bsz, n_ctx + 8, generator=g) > 0.3
    root_tokens = torch.randint(0, 60, (bsz,), generator=g)
    root_hidden, prev = torch.randn(bsz, 32, generator=g).to(dtype), torch.randn(bsz, 32, generator=g).to(dtype)
    root_logp = torch.log_softmax(torch.randn(bsz, 40, generator=g), -1)
    root_pos = torch.tensor([n_ctx - 1, n_ctx - 3, n_ctx - 2][:bsz])
    calls = {"chain": 0, "step": 0}
    real_chain, real_step = compiled_mod.CompiledStep.chain, compiled_mod.CompiledStep.__call__

    def chain(self, *a):
        calls["chain"] += 1
        return real_chain(self, *a)

    def step(self, *a):
        calls["step"] += 1
        return real_step(self, *a)

    monkeypatch.setattr(compiled_mod.CompiledStep, "chain", chain)
    monkeypatch.setattr(compiled_mod.CompiledStep, "__call__", step)
    out, level_logp = {}, []
    with torch.no_grad():
        for name in ("chain", "levels"):
            if name == "levels":
                monkeypatch.setattr(m, "chain_logp", lambda *a: None)
                step_logp = m.step_logp

                def recorded(*a, _step=step_logp):
                    got = _step(*a)
                    level_logp.append(got[1])
                    return got

                monkeypatch.setattr(m, "step_logp", recorded)
            ctx = TreeContext(k0.clone(), v0.clone(), seen.clone(), n_ctx)
            tree = draft_pool(m, ctx, root_tokens, root_hidden, root_logp, root_pos, steps, top_k, prev_hidden=prev,
                              width=1)
            assert ctx.length == n_ctx
            out[name] = (tree, ctx.k[:, :, :n_ctx + steps - 1], ctx.v[:, :, :n_ctx + steps - 1])
            if name == "chain":
                assert calls == {"chain": 1, "step": 0}
    assert calls == {"chain": 1, "step": steps - 1} and len(level_logp) == steps - 1
    tol = 1e-4
    # the two paths round differently (~1e-6); the tokens are compared where that cannot reorder the top
    # candidates: these seeded inputs keep every level's top top_k + 1 log-probabilities apart by far more
    for lp in [root_logp[:, None]] + level_logp:
        top = lp.float().topk(top_k + 1, dim=-1).values
        assert float((top[..., :-1] - top[..., 1:]).min()) > 4 * tol * max(1.0, float(top.abs().max()))
    (a, ka, va), (b, kb, vb) = out["chain"], out["levels"]
    for field in ("tokens", "parents", "depth", "valid", "anc"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    for x, y in ((a.logp, b.logp), (a.path_logp, b.path_logp), (a.features, b.features), (ka, kb), (va, vb)):
        assert x.dtype == y.dtype
        assert torch.allclose(x.float(), y.float(), rtol=tol, atol=tol * float(y.float().abs().max()))


@pytest.mark.parametrize(("arch", "dtype"), [("gpt_oss", "float32"), ("qwen3_moe", "bfloat16"),
                                           ("deepseek_v3", "float32")])
def test_compiled_chains_equal_compiled_ar(compiled, tiny_cache, agreeing_drafts, arch, dtype):
    """Speculation on pools drafted by the compiled chain call equals AR, at batch 1 and 3: chains (``top_k = 1``,
    the raw ranking) and width-one pools with runner-ups (``frontier: 1``, ``top_k = 2``, calibrated confidence
    and EcoSpec choosing among them)."""
    from specmoe_plugins.drafters.eagle3 import compiled as compiled_mod

    target = _target(tiny_cache, arch, dtype)  # DeepSeek-V3: eager target passes, the draft compiled all the same
    path = str(agreeing_drafts(arch, "eagle3"))
    pred = predictors.get("router_on_embedding")()
    pred.setup(target)
    calls = []
    real = compiled_mod.CompiledStep.chain
    compiled_mod.CompiledStep.chain = lambda self, *a: calls.append(a[-2:]) or real(self, *a)  # (steps, top_k)
    try:
        prompts = random_prompts(3, [2, 11, 29], target.vocab_size, seed=4)
        stop = StopRule(MAX_NEW)
        refs = [ar_generate(target, [p], temperature=0, stop=stop).tokens[0] for p in prompts]
        gens = []
        cases = [(None, "confidence", {"calibrated": False}, 2, 1), (None, "confidence", {"calibrated": False}, 4, 1),
                 (1, "confidence", {}, 3, 2), (1, "ecospec", {}, 3, 2)]
        for frontier, sel_name, opts, steps, top_k in cases:
            drafter = drafters.get("eagle3")(path=path, **({"frontier": frontier} if frontier else {}))
            drafter.setup(target)
            sel = selectors.get(sel_name)(**opts)
            engine = SpeculativeEngine(target, drafter, sel, pred if sel.needs_experts else None)
            case = f"{sel_name} steps {steps} top_k {top_k}"
            for p, ref in zip(prompts, refs):
                gens.append(engine.generate([p], budget=steps + 1, steps=steps, top_k=top_k, temperature=0,
                                            stop=stop))
                assert gens[-1].tokens[0] == ref, f"{arch} {dtype} {case}, prompt of {len(p)}"
            gens.append(engine.generate(prompts, budget=steps + 1, steps=steps, top_k=top_k, temperature=0,
                                        stop=stop))
            assert gens[-1].tokens == refs, f"{arch} {dtype} {case}, batch of 3"
    finally:
        compiled_mod.CompiledStep.chain = real
    assert sorted(set(calls)) == [(2, 1), (3, 2), (4, 1)] and len(calls) >= sum(len(g.steps) for g in gens) // 2
    assert multi_token_share(gens) >= MIN_MULTI


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
    target = _target(tiny_cache, "deepseek_v3")
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

    fast, slow = _target(tiny_cache, arch), _target(tiny_cache, arch, compile_=False)
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
    from specmoe.bench.expert_latency import forced_routing, override_routers

    target = _target(tiny_cache, "gpt_oss")
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
