# SPDX-License-Identifier: Apache-2.0
"""The EAGLE-3 draft's compiled decoding steps (:mod:`specmoe_plugins.drafters.eagle3.compiled`): a compiled step
computes the eager step (float32 and bfloat16), inputs beyond the compiled rows run eagerly, a decoding run
compiles nothing after its warm-up, a width-one pool drafted in one compiled call is the pool built level by
level, and speculation on such pools equals AR token for token (GPT-OSS, Qwen3-MoE, DeepSeek-V3; batch 1 and 3).
The target's compiled passes: ``test_compiled_pass.py``."""

from __future__ import annotations

import pytest
import torch
from fixtures.agreeing import MIN_MULTI, multi_token_share
from fixtures.compiled import MAX_NEW, compiled_target
from fixtures.tiny import random_prompts

from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.stopping import StopRule
from specmoe.registry import drafters, predictors, selectors


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

    # DeepSeek-V3: eager target passes, the draft compiled all the same
    target = compiled_target(tiny_cache, arch, dtype)
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
