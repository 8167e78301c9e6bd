# SPDX-License-Identifier: Apache-2.0
"""The reduced-precision CPU fast paths of the inference pass (issue 23.4): bf16 linear layers on packed oneDNN
weights, single-row bf16 products on torch's matrix-vector kernel, and union experts on weights re-stored
output-major. Each is checked against a float64 reference with the error of the model's own bf16
computation as the bound (never a machine-dependent rounding), and each test proves its path ran."""

from __future__ import annotations

import pytest
import torch
from fixtures.spies import count_calls

from specmoe.models import linear


@pytest.mark.parametrize("rows", [1, 4])
def test_bf16_linear_single_rows_take_the_matrix_vector_kernel(monkeypatch, rows):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=g), torch.randn(96, generator=g)
    x = torch.randn(1, rows, 64, generator=g)
    calls = count_calls(monkeypatch, linear, "single_row_reduced")
    with torch.no_grad():
        out = linear.linear(x.bfloat16(), w.bfloat16(), b.bfloat16())
        ref = torch.nn.functional.linear(x.bfloat16(), w.bfloat16(), b.bfloat16())
    gold = torch.nn.functional.linear(x.bfloat16().double(), w.bfloat16().double(), b.bfloat16().double())
    assert len(calls) == (rows == 1) and out.dtype == torch.bfloat16 and out.shape == (1, rows, 96)
    assert (out.double() - gold).abs().max() <= 2 * (ref.double() - gold).abs().max() + 1e-6
    assert torch.backends.mkldnn.enabled  # switched back on after the call
    # float32 and autograd never take it
    linear.linear(x[:, :1], w, b)
    linear.linear(x[:, :1].bfloat16().requires_grad_(), w.bfloat16(), b.bfloat16())
    assert len(calls) == (rows == 1)


def test_bf16_linear_layers_take_packed_weights_and_repack_when_they_change():
    """Installed bf16 ``nn.Linear`` layers run on the weight packed into oneDNN's layout, for 1 and 4 rows;
    an in-place update of the weight (an optimizer step) packs it again; autograd keeps ``F.linear``."""
    g = torch.Generator().manual_seed(3)
    layer = torch.nn.Linear(64, 96).bfloat16().requires_grad_(False)
    assert linear.install(torch.nn.Sequential(layer)) == 1
    for _ in range(2):
        for rows in (1, 4):
            x = torch.randn(2, rows, 64, generator=g).bfloat16()
            with torch.no_grad():
                out = layer(x)
                ref = torch.nn.functional.linear(x, layer.weight, layer.bias)
            gold = torch.nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double())
            assert out.dtype == torch.bfloat16 and out.shape == (2, rows, 96)
            assert (out.double() - gold).abs().max() <= 2 * (ref.double() - gold).abs().max() + 1e-6
        stamp, packed = layer.__dict__["_specmoe_packed"]
        # packed where oneDNN runs bf16 (AVX-512 / AMX); an AVX2-only CPU keeps F.linear (same numbers checked above)
        assert (packed is not None) == linear.onednn_bf16()
        assert stamp[:2] == (layer.weight.data_ptr(), layer.weight._version)
        with torch.no_grad():
            layer.weight.mul_(-2.0)  # the next pass must see the new weight
    trainable = torch.nn.Linear(64, 8).bfloat16()
    linear.install(trainable)
    trainable(torch.randn(1, 64, generator=g).bfloat16()).sum().backward()
    assert "_specmoe_packed" not in trainable.__dict__ and trainable.weight.grad is not None


def _gpt_oss(dtype: torch.dtype):
    import transformers

    from specmoe.models.tiny import tiny_config

    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(tiny_config("gpt_oss")).eval().requires_grad_(False)
    return model.to(dtype)


def test_prepare_restores_gpt_oss_experts_output_major_in_bf16_only():
    from specmoe_plugins.verifiers.union.reference import prepare

    for dtype, expect in ((torch.bfloat16, True), (torch.float32, False)):
        module = _gpt_oss(dtype).model.layers[0].mlp.experts
        before = module.gate_up_proj.detach().clone(), module.down_proj.detach().clone()
        assert prepare(module) is expect and prepare(module) is False  # idempotent
        for w, b in zip((module.gate_up_proj, module.down_proj), before):
            assert torch.equal(w, b) and w.shape == b.shape  # same values and shapes
            assert w.transpose(-2, -1).is_contiguous() is expect


def test_bf16_union_experts_on_prepared_weights(monkeypatch):
    """One token and 24 tokens (experts get several rows), every row through the matrix-vector kernel, against
    the float32 model; within twice the error of the model's own bf16 eager loop."""
    from specmoe_plugins.verifiers.union import reference as union_torch
    from specmoe_plugins.verifiers.union.reference import prepare, union_experts_forward

    monkeypatch.setattr(union_torch, "PACK_MAX_BYTES", 0)  # the unpacked route (packed: test_packed_weights.py)
    gold_model, model = _gpt_oss(torch.float32), _gpt_oss(torch.bfloat16)
    module, gold_module = model.model.layers[0].mlp.experts, gold_model.model.layers[0].mlp.experts
    prepare(module)
    calls = count_calls(monkeypatch, linear, "single_row_mm")
    g = torch.Generator().manual_seed(2)
    for t in (1, 24):
        hidden = torch.randn(t, module.gate_up_proj.shape[1], generator=g)
        idx = torch.stack([torch.randperm(module.gate_up_proj.shape[0], generator=g)[:2] for _ in range(t)])
        w = torch.softmax(torch.randn(t, 2, generator=g), dim=-1)
        gold = gold_module(hidden, idx, w)  # the model's eager loop in float32
        model.set_experts_implementation("eager")
        eager = module(hidden.bfloat16(), idx, w.bfloat16())
        calls.clear()
        out = union_experts_forward(module, hidden.bfloat16(), idx, w.bfloat16())
        # every slot row of both projections through the single-row kernel an AR step takes
        assert out.dtype == torch.bfloat16 and len(calls) == 2 * idx.numel()
        assert (out.float() - gold).abs().max() <= 2 * (eager.float() - gold).abs().max()
        # so a token's output does not depend on how many other tokens share its experts (greedy verification of
        # a tree computes what AR computes for that token): the same kernel on the same row, not a rounding claim
        alone = union_experts_forward(module, hidden[-1:].bfloat16(), idx[-1:], w[-1:].bfloat16())
        assert torch.equal(alone, out[-1:])
