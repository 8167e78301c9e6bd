# SPDX-License-Identifier: Apache-2.0
"""The reduced-precision CPU fast paths of the inference pass (issue 23.4): single-row bf16 linear layers on
torch's matrix-vector kernel, GPT-OSS sink attention on the CPU flash kernel, and union experts on weights
re-stored output-major. Each is checked against a float64 reference with the error of the model's own bf16
computation as the bound (never a machine-dependent rounding), and each test proves its path ran."""

from __future__ import annotations

import pytest
import torch

from specmoe.models import attention, linear


def _count(monkeypatch, module, name: str) -> list[int]:
    """Count the calls of ``module.name`` (the real function still runs)."""
    real = getattr(module, name)
    calls: list[int] = []

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("rows", [1, 4])
def test_bf16_linear_single_rows_take_the_matrix_vector_kernel(monkeypatch, rows):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=g), torch.randn(96, generator=g)
    x = torch.randn(1, rows, 64, generator=g)
    calls = _count(monkeypatch, linear, "single_row_reduced")
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


def _eager_sink_attention(q, k, v, mask, sinks, scale):
    """GPT-OSS's attention written out (repeat KV heads, sink logit in the softmax), in q's dtype."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = q @ k.transpose(-1, -2) * scale + mask
    logits = torch.cat([scores, sinks.view(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[2], 1)], dim=-1)
    probs = torch.softmax(logits.float(), dim=-1).to(q.dtype)[..., :-1]
    return (probs @ v).transpose(1, 2)


@pytest.mark.parametrize("n", [1, 4])
def test_bf16_sink_attention_takes_the_flash_kernel(monkeypatch, n):
    if attention._flash_cpu() is None:
        pytest.skip("this torch has no CPU flash-attention op")
    g = torch.Generator().manual_seed(1)
    s = 300 + n
    q, k, v = torch.randn(2, 4, n, 32, generator=g), torch.randn(2, 2, s, 32, generator=g), \
        torch.randn(2, 2, s, 32, generator=g)
    sinks = torch.randn(4, generator=g)
    allowed = torch.ones(n, s, dtype=torch.bool).tril(s - n)
    allowed[:, :7] = False  # a window-like hole
    mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[None, None].expand(2, 1, n, s)
    module = type("Attn", (), {"sinks": sinks.bfloat16()})()
    calls = _count(monkeypatch, attention, "_flash_cpu")
    out, _ = attention.grouped_attention(module, q.bfloat16(), k.bfloat16(), v.bfloat16(),
                                         mask.bfloat16(), scaling=32 ** -0.5)
    assert calls and out.dtype == torch.bfloat16 and out.shape == (2, n, 4, 32)
    gold = _eager_sink_attention(q.bfloat16().double(), k.bfloat16().double(), v.bfloat16().double(),
                                 mask.double(), sinks.bfloat16().double(), 32 ** -0.5)
    eager = _eager_sink_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask.bfloat16(), sinks.bfloat16(),
                                  32 ** -0.5)
    assert (out.double() - gold).abs().max() <= 2 * (eager.double() - gold).abs().max()
    calls.clear()  # float32 keeps the explicit path (row results independent of the pass's row count)
    attention.grouped_attention(type("Attn", (), {"sinks": sinks})(), q, k, v, mask, scaling=32 ** -0.5)
    assert not calls


def _gpt_oss(dtype: torch.dtype):
    import transformers

    from specmoe.models.tiny import tiny_config

    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(tiny_config("gpt_oss")).eval().requires_grad_(False)
    return model.to(dtype)


def test_prepare_restores_gpt_oss_experts_output_major_in_bf16_only():
    from specmoe.kernels.union_torch import prepare

    for dtype, expect in ((torch.bfloat16, True), (torch.float32, False)):
        module = _gpt_oss(dtype).model.layers[0].mlp.experts
        before = module.gate_up_proj.detach().clone(), module.down_proj.detach().clone()
        assert prepare(module) is expect and prepare(module) is False  # idempotent
        for w, b in zip((module.gate_up_proj, module.down_proj), before):
            assert torch.equal(w, b) and w.shape == b.shape  # same values and shapes
            assert w.transpose(-2, -1).is_contiguous() is expect


def test_bf16_union_experts_on_prepared_weights(monkeypatch):
    """One token (each expert gets one row: the matrix-vector kernel) and 24 tokens (experts get several rows:
    oneDNN), against the float32 model; within twice the error of the model's own bf16 eager loop."""
    from specmoe.kernels.union_torch import prepare, union_experts_forward

    gold_model, model = _gpt_oss(torch.float32), _gpt_oss(torch.bfloat16)
    module, gold_module = model.model.layers[0].mlp.experts, gold_model.model.layers[0].mlp.experts
    prepare(module)
    calls = _count(monkeypatch, linear, "single_row_mm")
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
        single = int((torch.bincount(idx.flatten()) == 1).sum())
        assert out.dtype == torch.bfloat16 and len(calls) == 2 * single  # both projections of 1-row experts
        assert (out.float() - gold).abs().max() <= 2 * (eager.float() - gold).abs().max()
