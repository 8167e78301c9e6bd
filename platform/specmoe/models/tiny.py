# SPDX-License-Identifier: Apache-2.0
"""Tiny configurations of the three supported MoE architectures, built locally (real ``transformers``
configs, saved and loaded like a released checkpoint; no hub access)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specmoe.utils.hashing import stable_hash

__all__ = ["TINY_CONFIGS", "tiny_config", "build_tiny_model", "ARCHITECTURES"]

#: model_type -> (config class name, causal-LM class name)
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
}

#: small but structurally complete settings (GPT-OSS: alternating sliding/full attention with biases;
#: DeepSeek-V3: a dense first layer, MLA, group routing and a shared expert)
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "gpt_oss": dict(vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
                    num_experts_per_tok=2, sliding_window=8, max_position_embeddings=131072,
                    initializer_range=0.2, tie_word_embeddings=False),
    "qwen3_moe": dict(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=1024,
                      initializer_range=0.2, tie_word_embeddings=False),
    "deepseek_v3": dict(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                        n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                        first_k_dense_replace=1, n_shared_experts=1, q_lora_rank=32, kv_lora_rank=16,
                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, max_position_embeddings=1024,
                        initializer_range=0.2, tie_word_embeddings=False, rope_interleave=False),
}


def tiny_config(arch: str, **overrides: Any):
    """A ``transformers`` config of architecture ``arch`` (``gpt_oss``, ``qwen3_moe``, ``deepseek_v3``)."""
    import transformers

    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture '{arch}'; choose one of {', '.join(ARCHITECTURES)}")
    cfg_cls = getattr(transformers, ARCHITECTURES[arch][0])
    kwargs = {**TINY_CONFIGS[arch], **overrides}
    cfg = cfg_cls(**kwargs)
    cfg.architectures = [ARCHITECTURES[arch][1]]
    return cfg


def build_tiny_model(arch: str, out_dir: str | Path, seed: int = 0, **overrides: Any) -> Path:
    """Build a randomly initialised tiny model and ``save_pretrained`` it into ``out_dir`` (deterministic in
    arch, seed, overrides; an existing complete directory is reused)."""
    import torch
    import transformers

    out = Path(out_dir)
    spec = json.dumps({"arch": arch, "seed": seed, **overrides}, sort_keys=True, default=str)
    marker = out / "specmoe_tiny.json"
    if marker.is_file() and marker.read_text() == spec:
        return out
    cfg = tiny_config(arch, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, ARCHITECTURES[arch][1])(cfg)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    marker.write_text(spec)
    return out


def spec_hash(arch: str, seed: int, overrides: dict[str, Any]) -> str:
    return stable_hash({"arch": arch, "seed": seed, **overrides}, 12)
