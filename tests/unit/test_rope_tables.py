"""specmoe.models.rope: rotary tables computed once give each pass what the model's rotary module gives."""

from __future__ import annotations

import torch
from transformers import GptOssConfig, LlamaConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from specmoe.models.rope import RopeTables, full_tables, rotate


def _rotate_half_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotate-half formula on half-width tables ``[B, 1, N, D / 2]``."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _modules():
    llama = LlamaRotaryEmbedding(LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, rope_theta=10000.0))
    gpt_oss = GptOssRotaryEmbedding(GptOssConfig(hidden_size=64, num_attention_heads=4, head_dim=16,
                                                 num_key_value_heads=2, rope_parameters={
                                                     "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                                     "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                                                     "original_max_position_embeddings": 4096}))
    return {"llama (full-width tables)": llama, "gpt-oss yarn (half-width tables)": gpt_oss}


def test_tables_match_the_module_and_grow():
    g = torch.Generator().manual_seed(0)
    for name, rotary in _modules().items():
        tables = RopeTables(rotary, 16)
        x = torch.randn(2, 4, 3, 16, generator=g)
        for positions in (torch.tensor([[0, 1, 2], [5, 6, 7]]), torch.tensor([[300, 301, 302], [1000, 1001, 1003]])):
            cos, sin = tables(x, positions)
            half_cos, half_sin = rotary(x, positions)
            half_cos, half_sin = half_cos[..., :8][:, None], half_sin[..., :8][:, None]
            assert cos.shape == (2, 1, 3, 16), name
            ref = _rotate_half_reference(x, half_cos, half_sin)
            assert torch.allclose(rotate(x, cos, sin), ref, rtol=1e-6, atol=1e-6), name
        assert tables._table is not None and tables._table[1].shape[0] >= 1004, name  # grew past the first 256


def test_full_tables_negate_the_first_half_of_sin():
    cos, sin = torch.rand(1, 3, 8), torch.rand(1, 3, 8)
    c, s = full_tables(cos, sin, 8)
    assert torch.equal(c, torch.cat((cos, cos), -1)) and torch.equal(s, torch.cat((-sin, sin), -1))
    c2, s2 = full_tables(torch.cat((cos, cos), -1), torch.cat((sin, sin), -1), 8)  # full-width input
    assert torch.equal(c2, c) and torch.equal(s2, s)


def test_dynamic_rope_is_asked_every_pass():
    rotary = LlamaRotaryEmbedding(LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16,
                                              rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    tables = RopeTables(rotary, 16)
    x = torch.randn(1, 4, 2, 16)
    cos, sin = tables(x, torch.tensor([[3, 4]]))
    assert tables._table is None and cos.shape == (1, 1, 2, 16)
    ref_cos, _ = rotary(x, torch.tensor([[3, 4]]))
    assert torch.allclose(cos[:, 0], full_tables(ref_cos, ref_cos, 8)[0])
