# SPDX-License-Identifier: Apache-2.0
"""The learned expert predictor's network (paper §4.1) and the loader of its exported directory.

Inference needs only this module (no Lightning); training is :mod:`.module`.
Network: token ids -> the target's frozen input embedding ``[T, H_t]`` -> linear projection to the backbone
width -> a small decoder-only backbone (any Hugging Face causal-LM architecture; its own token embedding is
dropped) -> linear head -> ``[T, L, E]`` routing logits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

__all__ = ["RoutingPredictorNet", "build_backbone", "load_predictor", "untrained_predictor", "DEFAULT_BACKBONE",
           "PREDICTOR_FORMAT"]

PREDICTOR_FORMAT = "specmoe-expert-predictor"

#: a tiny Qwen3 decoder (for tiny targets and tests)
DEFAULT_BACKBONE: dict[str, Any] = dict(model_type="qwen3", hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        head_dim=16, max_position_embeddings=4096)


def _strip_embedding(model: nn.Module) -> nn.Module:
    """Replace the backbone's token embedding by a 1-row stub (inputs always arrive as ``inputs_embeds``)."""
    hidden = int(model.config.hidden_size)
    stub = nn.Embedding(1, hidden)
    stub.weight.requires_grad_(False)
    model.set_input_embeddings(stub)
    model.config.vocab_size = 1
    model.config.pad_token_id = None
    return model


def build_backbone(backbone: Optional[str] = None, backbone_config: Optional[dict[str, Any]] = None,
                   attn_implementation: str = "sdpa") -> nn.Module:
    """The decoder-only body (``AutoModel``, no LM head) from a checkpoint / hub id, or a fresh config.

    Args:
        backbone: checkpoint directory or hub id (e.g. ``Qwen/Qwen3-0.6B``); None builds from a config.
        backbone_config: config keys (``model_type`` + fields) overriding :data:`DEFAULT_BACKBONE`; with
            ``backbone`` set, they override the checkpoint's config instead.
        attn_implementation: ``sdpa`` or ``eager`` (``flash_attention_2`` where installed).
    """
    import transformers

    if backbone:
        kwargs = dict(backbone_config or {})
        model = transformers.AutoModel.from_pretrained(backbone, dtype=torch.float32,
                                                       attn_implementation=attn_implementation, **kwargs)
    else:
        cfg = {**DEFAULT_BACKBONE, **(backbone_config or {})}
        model_type = cfg.pop("model_type")
        cfg.update(vocab_size=1, pad_token_id=None)
        config = transformers.AutoConfig.for_model(model_type, **cfg)
        model = transformers.AutoModel.from_config(config, attn_implementation=attn_implementation,
                                                   dtype=torch.float32)
    return _strip_embedding(model)


class RoutingPredictorNet(nn.Module):
    """Projection + backbone + routing head.

    Args:
        backbone: an ``AutoModel`` decoder (embedding stripped).
        target_hidden: width ``H_t`` of the target's embedding.
        num_layers: MoE layers ``L``.
        num_experts: experts per layer ``E``.
    """

    def __init__(self, backbone: nn.Module, target_hidden: int, num_layers: int, num_experts: int) -> None:
        super().__init__()
        hb = int(backbone.config.hidden_size)
        self.num_layers, self.num_experts = num_layers, num_experts
        self.proj = nn.Linear(target_hidden, hb, bias=False)
        self.backbone = backbone
        self.head = nn.Linear(hb, num_layers * num_experts)

    def forward(self, embeds: torch.Tensor, position_ids: torch.Tensor | None = None,
                attention_mask: Any = None, cache: Any = None) -> torch.Tensor:
        """``embeds [B, T, H_t]`` (target embeddings) -> ``[B, T, L, E]`` routing logits.

        ``attention_mask`` None means causal; a 4D additive mask (tree decoding) or a dict of them is passed
        through, as is ``cache`` (a ``transformers`` cache that the pass appends to).
        """
        h = self.proj(embeds.to(self.proj.weight.dtype))
        out = self.backbone(inputs_embeds=h, position_ids=position_ids, attention_mask=attention_mask,
                            cache=cache, use_cache=cache is not None)
        z = self.head(out.last_hidden_state)
        return z.view(*z.shape[:-1], self.num_layers, self.num_experts)


def load_predictor(path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                   attn_implementation: Optional[str] = None) -> tuple[RoutingPredictorNet, dict[str, Any]]:
    """Load an exported predictor directory -> ``(net in eval mode, predictor.json contents)``."""
    import transformers
    from safetensors.torch import load_file

    from specmoe.errors import UserError

    root = Path(path)
    if not (root / "predictor.json").is_file():
        raise UserError(f"'{path}' is not an exported expert predictor (no predictor.json): point 'path' at "
                        f"the 'predictor' (or 'milestones/<name>') directory written by train_predictor")
    meta = json.loads((root / "predictor.json").read_text())
    cfg = transformers.AutoConfig.from_pretrained(str(root))
    attn = attn_implementation or meta.get("attn_implementation") or "sdpa"
    body = transformers.AutoModel.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    body = _strip_embedding(body)
    net = RoutingPredictorNet(body, meta["target_hidden"], meta["num_layers"], meta["num_experts"])
    net.load_state_dict(load_file(str(root / "model.safetensors")), strict=True)
    return net.to(device=device, dtype=dtype).eval().requires_grad_(False), meta


def untrained_predictor(num_layers: int, num_experts: int, target_hidden: int, init: dict[str, Any],
                        attn_implementation: str = "sdpa") -> tuple[RoutingPredictorNet, dict[str, Any]]:
    """A predictor with seeded random weights -> ``(net in eval mode, its meta)``.

    ``init`` holds backbone config fields (over :data:`DEFAULT_BACKBONE`) and ``seed`` (default 0).
    """
    cfg = dict(init)
    torch.manual_seed(int(cfg.pop("seed", 0)))
    net = RoutingPredictorNet(build_backbone(None, cfg, attn_implementation), target_hidden, num_layers,
                              num_experts)
    meta = {"format": PREDICTOR_FORMAT, "num_layers": num_layers, "num_experts": num_experts,
            "target_hidden": target_hidden, "attn_implementation": attn_implementation, "random_weights": True}
    return net.eval().requires_grad_(False), meta
