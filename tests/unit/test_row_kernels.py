# SPDX-License-Identifier: Apache-2.0
"""The row-invariant CPU kernels (:mod:`specmoe.kernels.row_kernels`): each slot's expert MLP as the
graph form computes it (to rounding: float32 and bfloat16 weights, GPT-OSS's interleaved clamped gate with
biases and Qwen3-MoE's SiLU without), a slot's result the same bits alone as beside any other slots (sizes
that leave vector and unrolling tails), the compiled decoding pass calling it with speculation still equal to
AR, and the graph form's own loops where it is switched off."""

from __future__ import annotations

import pytest
import torch
from fixtures.agreeing import multi_token_share

from specmoe.kernels import row_kernels
from specmoe_plugins.verifiers.union import reference as union_torch

pytestmark = pytest.mark.skipif(not row_kernels.available(), reason="no C++ compiler for inductor's code cache")


def _weights(e: int, h: int, i: int, dtype: torch.dtype, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    gu = (torch.randn(e, h, 2 * i, generator=g) * 0.1).to(dtype)
    dn = (torch.randn(e, i, h, generator=g) * 0.1).to(dtype)
    b_gu = (torch.randn(e, 2 * i, generator=g) * 0.1).to(dtype) if bias else None
    b_d = (torch.randn(e, h, generator=g) * 0.1).to(dtype) if bias else None
    return gu, b_gu, dn, b_d


def _reference(x, experts, gu, b_gu, dn, b_d, inter, interleaved, swiglu_oai, alpha, limit):
    """Each slot alone in PyTorch: float32 products, each projection rounded to the weights' dtype."""
    dtype = gu.dtype
    h = torch.einsum("sk,skn->sn", x, gu[experts].float())
    if b_gu is not None:
        h = h + b_gu[experts].float()
    h = h.to(dtype).float()
    gate, up = (h[:, 0::2], h[:, 1::2]) if interleaved else h.split(inter, dim=-1)
    if swiglu_oai:
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
        a = (up + 1) * (gate * torch.sigmoid(gate * alpha))
    else:
        a = torch.nn.functional.silu(gate) * up
    a = a.to(dtype).float()
    y = torch.einsum("sk,skn->sn", a, dn[experts].float())
    if b_d is not None:
        y = y + b_d[experts].float()
    return y.to(dtype).float()


CASES = [  # (hidden, intermediate, interleaved, swiglu_oai, bias): the last leaves every tail of the loops
    (64, 64, True, True, True),
    (64, 48, False, False, False),
    (37, 21, True, True, True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_each_slot_is_its_expert_mlp(case, dtype):
    h, inter, interleaved, oai, bias = case
    gu, b_gu, dn, b_d = _weights(8, h, inter, dtype, bias)
    g = torch.Generator().manual_seed(1)
    experts = torch.randint(0, 8, (23,), generator=g).sort().values
    x = torch.randn(23, h, generator=g).to(dtype).float()
    args = (inter, interleaved, oai, 1.702, 7.0)
    got = row_kernels.row_experts(x, experts, gu, b_gu, dn, b_d, *args)
    want = _reference(x, experts, gu, b_gu, dn, b_d, *args)
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: a projection may round to the neighbouring value
    assert float((got - want).abs().max()) <= tol * float(want.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_a_slot_gets_the_same_bits_beside_any_other_slots(case, dtype):
    """Row invariance, what keeps speculation lossless: one expert's slots are computed in blocks of up to four,
    a slot repeating the previous slot's input takes its result, and a slot's result must not depend on the
    block, the group or the pass it is in."""
    h, inter, interleaved, oai, bias = case
    gu, b_gu, dn, b_d = _weights(6, h, inter, dtype, bias, seed=2)
    g = torch.Generator().manual_seed(3)
    experts = torch.tensor([0, 0, 0, 0, 0, 0, 0, 1, 3, 3, 5, 5, 5, 5, 5])  # groups of 7, 1, 2 and 5 slots
    x = torch.randn(len(experts), h, generator=g).to(dtype).float()
    x[1], x[2], x[12] = x[0], x[0], x[11]  # repeated inputs (a one-token pass runs as two rows) share a result
    args = (inter, interleaved, oai, 1.702, 7.0)
    full = row_kernels.row_experts(x, experts, gu, b_gu, dn, b_d, *args)
    for s in range(len(experts)):
        alone = row_kernels.row_experts(x[s:s + 1], experts[s:s + 1], gu, b_gu, dn, b_d, *args)
        assert torch.equal(alone[0], full[s]), f"slot {s}"
    pairs = row_kernels.row_experts(x[2:5], experts[2:5], gu, b_gu, dn, b_d, *args)
    assert torch.equal(pairs, full[2:5])


def _graph_experts_of(target):
    module = target.model.model.layers[0].mlp.experts
    return union_torch.graph_experts(module), module


def test_the_graph_form_calls_the_kernel_and_keeps_its_loops_when_switched_off(tiny_cache, monkeypatch):
    from fixtures.agreeing import predictable_checkpoint

    from specmoe.registry import targets

    target = targets.get("hf")(path=str(predictable_checkpoint("gpt_oss", tiny_cache)), dtype="float32")
    form, module = _graph_experts_of(target)
    assert form.forward.args[0].kernel
    hidden = torch.randn(3, union_torch._layout(module).hidden)
    idx = torch.tensor([[0, 1], [1, 2], [0, 2]])
    wts = torch.softmax(torch.randn(3, 2), -1)
    with_kernel = form.forward(form.weights(), hidden, idx, wts)
    monkeypatch.setenv("SPECMOE_ROW_KERNELS", "0")
    loops, _ = _graph_experts_of(target)
    assert not loops.forward.args[0].kernel
    without = loops.forward(loops.weights(), hidden, idx, wts)
    # the two sum in different orders (and the loops' order depends on the CPU's vector width): equal to float32
    # rounding of the largest output, where a wrong expert, weight or combine would be off by its own size
    err = float((with_kernel - without).abs().max())
    assert err <= 1e-4 * float(without.abs().max()), err


@pytest.mark.parametrize(("arch", "dtype"), [("gpt_oss", "float32"), ("qwen3_moe", "bfloat16")])
def test_compiled_speculation_through_the_kernel_equals_compiled_ar(compiled, tiny_cache, agreeing_drafts,
                                                                     monkeypatch, arch, dtype):
    from fixtures.agreeing import predictable_checkpoint
    from fixtures.tiny import random_prompts

    from specmoe.decoding.ar import ar_generate
    from specmoe.decoding.engine import SpeculativeEngine
    from specmoe.decoding.stopping import StopRule
    from specmoe.registry import drafters, predictors, selectors, targets, verifiers

    calls = {"experts": 0, "linear": 0}
    for name, fn in list(row_kernels._FN.items()):
        def counted(*args, _fn=fn, _name=name):
            calls[_name] += 1
            return _fn(*args)

        monkeypatch.setitem(row_kernels._FN, name, counted)
    target = targets.get("hf")(path=str(predictable_checkpoint(arch, tiny_cache)), dtype=dtype)
    verifiers.get("torch_union")().install(target)
    assert target._graph is not None and target._graph.state == "ready", target._graph.reason
    drafter = drafters.get("eagle3")(path=str(agreeing_drafts(arch, "eagle3")))
    drafter.setup(target)
    pred = predictors.get("router_on_embedding")()
    pred.setup(target)
    prompts = random_prompts(2, [3, 17], target.vocab_size, seed=5)
    stop = StopRule(16)
    refs = [ar_generate(target, [p], temperature=0, stop=stop).tokens[0] for p in prompts]
    before = dict(calls)
    engine = SpeculativeEngine(target, drafter, selectors.get("ecospec")(), pred)
    gens = [engine.generate([p], budget=4, steps=3, top_k=2, temperature=0, stop=stop) for p in prompts]
    assert [g.tokens[0] for g in gens] == refs
    layers = len(target.model.model.layers)
    passes = sum(len(g.steps) for g in gens)
    assert calls["experts"] - before["experts"] >= layers * passes // 2, "verification ran the experts kernel"
    assert calls["linear"] - before["linear"] >= layers * passes // 2, "verification ran the linear kernel"
    assert multi_token_share(gens) > 0.3
