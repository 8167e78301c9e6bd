# SPDX-License-Identifier: Apache-2.0
"""Weights packed into oneDNN's layout on CPUs (issue 23.4): float32 ``nn.Linear`` layers above
``FP32_PACK_MIN`` weights (``specmoe.models.linear``) and the experts of the union verifier
(``specmoe_plugins.verifiers.union.reference.packed_experts``, float32; bf16 experts must stay unpacked).

Each route is checked against a float64 reference with the error of the unpacked computation as the bound
(never a machine-dependent rounding), proven to run (its calls counted), repacked when the weights change and
never taken with autograd. Where this CPU's oneDNN has no kernel that gives a row the same result whatever the
number of rows beside it (``packed_row_invariant``, a trial at run time), the weights must stay unpacked; the
test checks that instead. Greedy speculative decoding equal to AR over these routes is tested by the
losslessness tests, which run whichever route the machine takes."""

from __future__ import annotations

import pytest
import torch
from fixtures.spies import count_calls

from specmoe.models import linear
from specmoe_plugins.verifiers.union import reference as union_torch


def test_float32_layers_above_the_threshold_take_the_packed_weight(monkeypatch):
    g = torch.Generator().manual_seed(0)
    big = torch.nn.Linear(256, linear.FP32_PACK_MIN // 256 + 8).requires_grad_(False)
    small = torch.nn.Linear(64, 32).requires_grad_(False)
    linear.install(torch.nn.Sequential(big, small))
    calls = count_calls(monkeypatch, linear, "packed_linear")
    expect = linear.packed_row_invariant(torch.float32, *big.weight.shape)
    for _ in range(2):
        for rows in (1, 4):
            x = torch.randn(1, rows, 256, generator=g)
            calls.clear()
            with torch.no_grad():
                out = big(x)
            ref = torch.nn.functional.linear(x, big.weight, big.bias)
            gold = torch.nn.functional.linear(x.double(), big.weight.double(), big.bias.double())
            assert len(calls) == int(expect) and out.shape == ref.shape and out.dtype == torch.float32
            # the worst-case error of any float32 summation order (K u |x| |W|): no claim on this CPU's rounding
            k, u = x.shape[-1] + 1, 2.0 ** -24
            worst = k * u * (x.double().abs() @ big.weight.double().abs().t() + big.bias.double().abs())
            assert bool(((out.double() - gold).abs() <= worst).all())
        stamp, packed = big.__dict__["_specmoe_packed"]
        assert (packed is not None) == expect and stamp[:2] == (big.weight.data_ptr(), big.weight._version)
        with torch.no_grad():
            big.weight.mul_(-2.0)  # the next pass must see the new weight
    calls.clear()
    with torch.no_grad():
        small(torch.randn(1, 64, generator=g))
    assert not calls and "_specmoe_packed" not in small.__dict__  # small layers keep the unpacked routes
    trainable = torch.nn.Linear(256, linear.FP32_PACK_MIN // 256 + 8)
    linear.install(trainable)
    trainable(torch.randn(2, 256, generator=g)).sum().backward()
    assert "_specmoe_packed" not in trainable.__dict__ and trainable.weight.grad is not None


def _experts(dtype: torch.dtype):
    import transformers

    from specmoe.models.tiny import tiny_config

    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(tiny_config("gpt_oss")).eval().requires_grad_(False).to(dtype)
    model.set_experts_implementation("eager")
    return model.model.layers[0].mlp.experts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_union_experts_on_packed_weights(monkeypatch, dtype):
    """A decoding step (1 token) and a verification pass (6 tokens, experts with several rows) on the packed
    float32 expert weights: within the unpacked route's error of the float64 experts, one packed product per
    union expert and projection, each token's output the same alone as beside the others, repacked on a change.
    bf16: never packed (every pass takes the single-row route an AR step takes)."""
    module = _experts(dtype)
    gold_module = _experts(torch.float64)
    union_torch.prepare(module)
    lay = union_torch._layout(module)
    # float32 only (bf16 keeps the single-row route everywhere: test_bf16_paths.py), where the trial passes
    expect = dtype == torch.float32 and (linear.packed_row_invariant(dtype, 2 * lay.intermediate, lay.hidden)
                                         and linear.packed_row_invariant(dtype, lay.hidden, lay.intermediate))
    calls = count_calls(monkeypatch, linear, "packed_linear")
    g = torch.Generator().manual_seed(2)
    for t in (1, 6):
        hidden = torch.randn(t, lay.hidden, generator=g)
        idx = torch.stack([torch.randperm(lay.num_experts, generator=g)[:2] for _ in range(t)])
        w = torch.softmax(torch.randn(t, 2, generator=g), dim=-1)
        gold = gold_module(hidden.to(dtype).double(), idx, w.to(dtype).double())
        calls.clear()
        with torch.no_grad():
            out = union_torch.union_experts_forward(module, hidden.to(dtype), idx, w.to(dtype))
            with monkeypatch.context() as m:
                m.setattr(union_torch, "PACK_MAX_BYTES", 0)
                plain = union_torch.union_experts_forward(module, hidden.to(dtype), idx, w.to(dtype))
        assert out.dtype == dtype and out.shape == (t, lay.hidden)
        assert len(calls) == (2 * len(set(idx.flatten().tolist())) if expect else 0)
        bound = 2 * (plain.double() - gold).abs().max() + (1e-2 if dtype == torch.bfloat16 else 1e-5)
        assert (out.double() - gold).abs().max() <= bound
        if expect:  # the packed route is taken only where each row is computed alike for any row count
            alone = union_torch.union_experts_forward(module, hidden[-1:].to(dtype), idx[-1:], w[-1:].to(dtype))
            assert torch.equal(alone, out[-1:])
    assert (union_torch.packed_experts(module) is not None) == expect
    if expect:
        before = union_torch.packed_experts(module)
        with torch.no_grad():
            module.down_proj.mul_(0.5)
        assert union_torch.packed_experts(module) is not before  # rebuilt from the new weights
        trainable = _experts(dtype).requires_grad_(True)
        assert union_torch.packed_experts(trainable) is None
