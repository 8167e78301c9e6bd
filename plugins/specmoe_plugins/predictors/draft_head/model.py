# SPDX-License-Identifier: Apache-2.0
"""The ``draft_head`` expert predictor's network: a routing head on the drafter's own per-node features.

Inference needs only this module (no Lightning); training is :mod:`.module`.

Input of a node: the drafter state that proposed it (:attr:`~specmoe.interfaces.tree.DraftTree.features`,
``[.., F]``) and, optionally, its token's target input embedding (``[.., H_t]``). Both are RMS-normalised and
projected to a code of width ``rank``; the code becomes ``[.., L, E]`` routing logits::

    code   = W_f rmsnorm(feature) (+ W_e rmsnorm(embed(token)))      [.., rank]
    lowrank: logits = U code + b
    mlp:     logits = U gelu(code + c) + b
    linear:  logits = W [rmsnorm(feature); rmsnorm(embed(token))] + b  (full rank: no code)

The token term of ``lowrank`` / ``mlp`` depends on the token id only, so inference looks it up in a
``[V, rank]`` table computed once (:meth:`DraftHeadNet.token_table`). Exported directory::

    draft_head.json     format, network config (:class:`DraftHeadConfig`), the drafter it was trained on,
                        held-out accuracy and training step
    model.safetensors   weights
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from specmoe.decoding.expert_sets import topk_mask

__all__ = ["DRAFT_HEAD_FORMAT", "DraftHeadConfig", "DraftHeadNet", "predict_sets", "save_draft_head",
           "load_draft_head"]

DRAFT_HEAD_FORMAT = "specmoe-draft-head"
KINDS = ("lowrank", "mlp", "linear")


@dataclass
class DraftHeadConfig:
    """Shape of a draft head.

    Attributes:
        feature_size: drafter feature width ``F``.
        embed_size: target embedding width ``H_t`` (used when ``use_embedding``).
        num_layers, num_experts, top_k: the target's routing shape ``L``, ``E``, ``K``.
        kind: ``lowrank``, ``mlp`` or ``linear`` (see the module docstring).
        rank: code width of ``lowrank`` / ``mlp``.
        use_embedding: add the node token's target embedding to the input.
    """

    feature_size: int
    embed_size: int
    num_layers: int
    num_experts: int
    top_k: int
    kind: str = "mlp"
    rank: int = 64
    use_embedding: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            from specmoe.errors import UserError

            raise UserError(f"draft head kind '{self.kind}' is not one of {', '.join(KINDS)}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DraftHeadConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class DraftHeadNet(nn.Module):
    """Drafter feature (+ token embedding) -> per-layer routing logits."""

    def __init__(self, config: DraftHeadConfig) -> None:
        super().__init__()
        c = self.config = config
        out = c.num_layers * c.num_experts
        self.feature_norm = nn.RMSNorm(c.feature_size)
        self.embed_norm = nn.RMSNorm(c.embed_size) if c.use_embedding else None
        if c.kind == "linear":
            self.feature_proj = nn.Linear(c.feature_size, out)
            self.embed_proj = nn.Linear(c.embed_size, out, bias=False) if c.use_embedding else None
            self.out = None
        else:
            self.feature_proj = nn.Linear(c.feature_size, c.rank, bias=c.kind == "mlp")
            self.embed_proj = nn.Linear(c.embed_size, c.rank, bias=False) if c.use_embedding else None
            self.out = nn.Linear(c.rank, out)

    def token_term(self, embeds: torch.Tensor) -> torch.Tensor:
        """``[.., H_t]`` token embeddings -> their additive term ``[.., rank]`` (``[.., L * E]`` for ``linear``)."""
        return self.embed_proj(self.embed_norm(embeds.to(self.embed_proj.weight.dtype)))

    @torch.no_grad()
    def token_table(self, embed: Callable[[torch.Tensor], torch.Tensor], vocab_size: int,
                    chunk: int = 8192) -> torch.Tensor:
        """The token term of every id ``[V, rank]`` (``embed``: ids -> target embeddings)."""
        dev = self.feature_proj.weight.device
        parts = [self.token_term(embed(torch.arange(s, min(s + chunk, vocab_size), device=dev)).to(dev))
                 for s in range(0, vocab_size, chunk)]
        return torch.cat(parts, dim=0)

    def forward(self, features: torch.Tensor, embeds: Optional[torch.Tensor] = None,
                token_term: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``features [.., F]`` and the tokens' ``embeds [.., H_t]`` (or their precomputed ``token_term``) ->
        ``[.., L, E]`` routing logits."""
        c = self.config
        z = self.feature_proj(self.feature_norm(features.to(self.feature_proj.weight.dtype)))
        if c.use_embedding:
            z = z + (token_term if token_term is not None else self.token_term(embeds))
        if self.out is not None:
            z = self.out(nn.functional.gelu(z) if c.kind == "mlp" else z)
        return z.view(*z.shape[:-1], c.num_layers, c.num_experts)


def predict_sets(net: DraftHeadNet, features: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor,
                 table: Optional[torch.Tensor] = None,
                 embed: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> torch.Tensor:
    """What the ``draft_head`` predictor computes per tree: ``[B, N, L, E]`` bool top-K sets of every node.

    Args:
        features: ``[B, N, F]`` node features; tokens: ``[B, N]`` their target ids; valid: ``[B, N]``.
        table: the ``[V, rank]`` token terms (:meth:`DraftHeadNet.token_table`); else ``embed`` (ids ->
            target embeddings) is called on ``tokens``.
    """
    if not net.config.use_embedding:
        logits = net(features)
    elif table is not None:
        logits = net(features, token_term=table[tokens])
    else:
        logits = net(features, embed(tokens))
    sets = topk_mask(logits, net.config.top_k)
    return sets if bool(valid.all()) else sets & valid[:, :, None, None]


def save_draft_head(net: DraftHeadNet, out_dir: str | Path, meta: Optional[dict[str, Any]] = None) -> Path:
    """Write the exported directory (see the module docstring); ``meta`` is stored beside the config."""
    from safetensors.torch import save_file

    from specmoe.utils.files import atomic_path, atomic_write

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "model.safetensors") as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in net.state_dict().items()}, str(tmp))
    atomic_write(out / "draft_head.json", json.dumps(
        {"format": DRAFT_HEAD_FORMAT, "version": 1, "config": asdict(net.config), **(meta or {})},
        indent=1, default=str))
    return out


def load_draft_head(path: str | Path, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32) -> tuple[DraftHeadNet, dict[str, Any]]:
    """Load an exported directory -> ``(net in eval mode, draft_head.json contents)``."""
    from safetensors.torch import load_file

    from specmoe.errors import UserError

    root = Path(path)
    if not (root / "draft_head.json").is_file():
        raise UserError(f"'{path}' is not an exported draft head (no draft_head.json): point 'path' at the "
                        f"'head' (or 'milestones/<name>') directory written by train_draft_head")
    meta = json.loads((root / "draft_head.json").read_text())
    if meta.get("format") != DRAFT_HEAD_FORMAT:
        raise UserError(f"{root / 'draft_head.json'} is not a draft head (format {meta.get('format')!r})")
    net = DraftHeadNet(DraftHeadConfig.from_dict(meta["config"]))
    net.load_state_dict(load_file(str(root / "model.safetensors")), strict=True)
    return net.to(device=device, dtype=dtype).eval().requires_grad_(False), meta
