# SPDX-License-Identifier: Apache-2.0
"""FusedLinear (``specmoe.models.linear``): the inference projections of the lean path and the EAGLE-3 draft.

One product over several layers' concatenated weights equals the layers' own outputs; a lone float32 layer runs
as it is (no copy); small reduced-precision CPU layers accumulate in float32 over an exact copy, large ones keep
their dtype; a change of weights, dtype or device rebuilds it; the EAGLE-3 draft's inference path (fused) equals its
training path (the layers one by one)."""

from __future__ import annotations

import torch

from specmoe.models.linear import FP32_COPY_MAX, FusedLinear
from specmoe.registry import drafters, targets


def _layers(*shapes, bias=True, seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Linear(i, o, bias=bias).requires_grad_(False) for o, i in shapes]


def test_concatenated_product_equals_each_layer():
    layers = _layers((8, 16), (4, 16), (4, 16))
    fused = FusedLinear(layers)
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(fused(x), torch.cat([m(x) for m in layers], dim=-1), rtol=1e-6, atol=1e-6)
    assert fused._lin is not None


def test_lone_float32_layer_runs_as_it_is():
    (layer,) = _layers((8, 16))
    fused = FusedLinear([layer], keep_float=True)
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(1))
    assert torch.equal(fused(x), layer(x)) and fused._lin is None


def test_reduced_precision_small_layers_accumulate_in_float32_large_keep_their_dtype():
    small = [m.to(torch.bfloat16) for m in _layers((8, 16), (8, 16))]
    fused = FusedLinear(small)
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(1)).bfloat16()
    y = fused(x)
    assert fused.reduced and fused._lin.weight.dtype == torch.float32 and y.dtype == torch.bfloat16
    exact = torch.cat([x.float() @ m.weight.float().t() + m.bias.float() for m in small], dim=-1)
    torch.testing.assert_close(y.float(), exact, rtol=1e-2, atol=1e-2)  # one bf16 rounding of the output
    assert FusedLinear(small, keep_float=True)(x).dtype == torch.float32
    big = [torch.nn.Linear(256, FP32_COPY_MAX // 256 + 1, bias=False).requires_grad_(False).to(torch.bfloat16)]
    fb = FusedLinear(big)
    out = fb(torch.randn(1, 256).bfloat16())
    assert not fb.reduced and out.dtype == torch.bfloat16


def test_rebuilt_when_weights_or_dtype_change():
    layers = _layers((8, 16), (8, 16))
    fused = FusedLinear(layers)
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(1))
    before = fused(x)
    layers[1].weight.mul_(2.0)  # in place: the version counter moves
    after = fused(x)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, torch.cat([m(x) for m in layers], dim=-1), rtol=1e-6, atol=1e-6)
    for m in layers:
        m.to(torch.bfloat16)
    assert fused(x.bfloat16()).dtype == torch.bfloat16 and fused.reduced


def test_row_variant_route_is_an_input_major_float32_product_rebuilt_on_change():
    """``row_invariant=False`` (drafters): ``x @ W^T`` over an ``[in, out]`` float32 copy; the same values as the
    layers, bf16 layers up to FP32_COPY_MAX included (cast back), larger ones on their own kernel."""
    layers = _layers((8, 16), (4, 16))
    fused = FusedLinear(layers, row_invariant=False)
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(1))
    y = fused(x)
    w, b = fused._in_major
    assert w.shape == (16, 12) and w.is_contiguous() and b.shape == (12,) and fused._lin is None
    torch.testing.assert_close(y, torch.cat([m(x) for m in layers], dim=-1), rtol=1e-5, atol=1e-5)
    layers[0].weight.mul_(3.0)
    torch.testing.assert_close(fused(x), torch.cat([m(x) for m in layers], dim=-1), rtol=1e-5, atol=1e-5)
    small = [m.to(torch.bfloat16) for m in _layers((8, 16), bias=False)]
    fs = FusedLinear(small, keep_float=True, row_invariant=False)
    out = fs(x.bfloat16())
    assert fs._in_major[0].dtype == torch.float32 and out.dtype == torch.float32
    torch.testing.assert_close(out, x.bfloat16().float() @ small[0].weight.float().t(), rtol=1e-5, atol=1e-5)
    assert FusedLinear(small, row_invariant=False)(x.bfloat16()).dtype == torch.bfloat16
    big = [torch.nn.Linear(256, FP32_COPY_MAX // 256 + 1, bias=False).requires_grad_(False).to(torch.bfloat16)]
    fb = FusedLinear(big, row_invariant=False)
    assert fb(torch.randn(1, 256).bfloat16()).dtype == torch.bfloat16 and fb._in_major is None


def test_eagle3_inference_path_equals_its_training_path(tmp_path):
    torch.set_num_threads(1)
    target = targets.get("hf")(tiny={"arch": "gpt_oss", "seed": 1}, cache_dir=str(tmp_path))
    drafter = drafters.get("eagle3")(init={"seed": 0})
    drafter.setup(target)
    m = drafter.model
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, target.vocab_size, (2, 5), generator=g)
    feats = torch.randn(2, 5, m.config.fused_size, generator=g)
    pos = torch.arange(5).expand(2, 5)
    allowed = torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 5, 5)

    def run():
        h = m.project(feats)
        out, _, _ = m.step(tokens, h, pos, None, None, allowed)
        return m.logits(out)

    with torch.no_grad():
        fused = run()
    with torch.enable_grad():
        plain = run().detach()
    parts = m.__dict__.get("_inference_parts")  # the inference path built its fused projections, row-variant
    assert parts is not None and all(not f.row_invariant and f._in_major is not None
                                     for f in (parts.fc, parts.qkv, parts.o, parts.gate_up, parts.down, parts.lm_head))
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-4)
