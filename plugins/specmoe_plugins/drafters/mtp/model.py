# SPDX-License-Identifier: Apache-2.0
"""DeepSeek-V3 style multi-token-prediction (MTP) head, usable for any of the supported MoE targets.

One draft step (DeepSeek-V3 report §2.2; the ``transformers`` 5.24 ``MtpLayer`` and vLLM ``deepseek_mtp``
compute the same)::

    e = enorm(embed(token))          # zeroed at slot position 0, as vLLM does
    h = hnorm(previous hidden)       # the target's final *normalized* hidden state, or the head's own output
    x = eh_proj([e, h])              # Linear(2H -> H), embedding first
    o = block(x)                     # one decoder block of the target's architecture (residuals inside)
    logits = head(norm(o))           # shared_head.{norm,head}; the target's final norm / lm_head if absent

Slot convention: the slot at position ``p`` pairs the target hidden state of position ``p`` with the embedding
of token ``p + 1`` and predicts token ``p + 2`` (vLLM's layout; RoPE uses ``p``). For deeper draft levels
the head's own output replaces the target hidden state (``recurse``): ``normed`` feeds ``norm(o)`` back (what
``transformers`` 5.24 does, and the same kind of vector as the normalized target hidden state it was trained
on); ``block`` feeds the pre-norm ``o`` (what vLLM does).

The block is the architecture's own decoder layer class built from the target config (``layer_idx`` 0, one
layer, full attention). ``mlp: moe`` keeps the architecture's sparse MLP (DeepSeek-V3 checkpoints ship an MoE
block); ``mlp: dense`` (the default for heads we train) swaps in a SwiGLU MLP with DeepSeek's dense key
names: a drafter should be cheap to run and not add expert loads of its own, and GPT-OSS has no dense MLP.
The block's forward is run step by step (norm, attention, residual, norm, MLP, residual), which is the
structure of all three supported decoder layers, so the swapped MLP may return a plain tensor.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable, Iterator, Optional

import torch
from torch import nn

from specmoe.errors import UserError

__all__ = ["MTPSpec", "DenseMLP", "MTPHead", "block_config", "build_head", "depth_mask", "unroll"]


@dataclass
class MTPSpec:
    """Shape of an MTP head (stored in a trained head's ``config.json`` under ``specmoe_mtp``)."""

    mlp: str = "dense"
    """``dense`` (SwiGLU ``gate/up/down_proj``) or ``moe`` (the architecture's sparse MLP)."""
    intermediate_size: Optional[int] = None
    """dense MLP width; default: the target config's ``intermediate_size``."""
    recurse: str = "normed"
    """hidden fed to the next draft depth: ``normed`` (norm(o)) or ``block`` (o)."""
    own_norm: bool = True
    """the head has its own ``shared_head.norm`` (else the target's final norm)."""
    own_head: bool = False
    """the head has its own ``shared_head.head`` (else the target's ``lm_head``)."""
    own_embed: bool = False
    """the head has its own ``embed_tokens`` (else the target's input embeddings)."""

    def __post_init__(self) -> None:
        if self.mlp not in ("dense", "moe"):
            raise UserError(f"MTP head: mlp '{self.mlp}' must be 'dense' or 'moe'")
        if self.recurse not in ("normed", "block"):
            raise UserError(f"MTP head: recurse '{self.recurse}' must be 'normed' or 'block'")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MTPSpec":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_keys(cls, keys: Iterable[str], recurse: str = "normed") -> "MTPSpec":
        """Infer the spec of a released checkpoint (no ``specmoe_mtp`` section) from its tensor names."""
        keys = set(keys)
        moe = any(k.startswith(("mlp.experts", "mlp.gate.")) for k in keys)
        return cls(mlp="moe" if moe else "dense", recurse=recurse, own_norm="shared_head.norm.weight" in keys,
                   own_head="shared_head.head.weight" in keys, own_embed="embed_tokens.weight" in keys)


class DenseMLP(nn.Module):
    """SwiGLU MLP ``down(act(gate(x)) * up(x))`` with DeepSeek's dense-layer parameter names."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str = "silu") -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act_fn = ACT2FN[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def block_config(config: Any, spec: MTPSpec) -> Any:
    """Copy of the target config for a one-layer block at ``layer_idx`` 0 (full attention; MoE if asked)."""
    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = ["full_attention"]
    if hasattr(cfg, "first_k_dense_replace"):
        cfg.first_k_dense_replace = 0  # DeepSeek: layer 0 gets the MoE block (as get_mtp_config does)
    if hasattr(cfg, "mlp_only_layers"):
        cfg.mlp_only_layers = []  # Qwen3-MoE: layer 0 sparse
    return cfg


class MTPHead(nn.Module):
    """enorm / hnorm / eh_proj + one decoder block + optional own shared head and embedding.

    Shared target modules (embedding, ``lm_head``, final norm, rotary embedding) are referenced, not owned:
    they are not in this module's ``state_dict`` and receive no gradient. Call :meth:`bind` before use.

    Args:
        config: block config (:func:`block_config`).
        spec: head shape.
        layer_cls: the target's decoder layer class.
        norm_cls: the target's RMSNorm class.
    """

    def __init__(self, config: Any, spec: MTPSpec, layer_cls: type, norm_cls: type) -> None:
        super().__init__()
        h, eps = int(config.hidden_size), float(config.rms_norm_eps)
        self.config = config
        self.spec = spec
        self.enorm = norm_cls(h, eps=eps)
        self.hnorm = norm_cls(h, eps=eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.block = layer_cls(config, 0)
        if spec.mlp == "dense":
            width = int(spec.intermediate_size or config.intermediate_size)
            self.block.mlp = DenseMLP(h, width, getattr(config, "hidden_act", "silu"))
        self.shared_head = nn.Module()
        if spec.own_norm:
            self.shared_head.norm = norm_cls(h, eps=eps)
        if spec.own_head:
            self.shared_head.head = nn.Linear(h, int(config.vocab_size), bias=False)
        if spec.own_embed:
            self.embed_tokens = nn.Embedding(int(config.vocab_size), h)
        self._shared: dict[str, nn.Module] = {}  # plain dict: never registered as submodules

    # ------------------------------------------------------------------ wiring
    def bind(self, parts: Any) -> None:
        """Reference the target's embedding, ``lm_head``, final norm and rotary embedding
        (``parts``: :class:`~specmoe.interfaces.target.TargetParts`)."""
        self._shared = {"embed": parts.embed_tokens, "head": parts.lm_head, "norm": parts.final_norm,
                        "rotary": parts.rotary_emb}

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids) if self.spec.own_embed else self._shared["embed"](ids)

    def out_norm(self, o: torch.Tensor) -> torch.Tensor:
        # .to(o.device): with device_map the target's final norm / lm_head may live on another GPU
        return self.shared_head.norm(o) if self.spec.own_norm else self._shared["norm"](o).to(o.device)

    def logits(self, o: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` block output -> ``[..., V]`` logits (on ``o``'s device)."""
        x = self.out_norm(o)
        if self.spec.own_head:
            return self.shared_head.head(x)
        head = self._shared["head"]
        return head(x.to(head.weight.dtype)).to(o.device)

    def recurse(self, o: torch.Tensor) -> torch.Tensor:
        """The hidden state fed to the next draft depth."""
        return self.out_norm(o) if self.spec.recurse == "normed" else o

    # ------------------------------------------------------------------ compute
    def forward(self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, mask: Any,
                cache: Any = None) -> torch.Tensor:
        """One MTP pass over ``N`` slots.

        Args:
            ids: ``[B, N]`` token ids (token ``p + 1`` for the slot at position ``p``).
            hidden: ``[B, N, H]`` previous hidden states (target hidden at ``p`` or the head's recursion).
            positions: ``[B, N]`` slot positions (RoPE).
            mask: additive float mask ``[B, 1, N, S + N]`` over cached + new slots.
            cache: a ``transformers`` cache (the block's attention is layer 0), or ``None``.

        Returns:
            ``[B, N, H]`` block output ``o`` (pre-norm; see :meth:`logits`, :meth:`recurse`).
        """
        e = self.embed(ids).to(self.eh_proj.weight.dtype)  # the target may run in another dtype
        e = e * (positions != 0).unsqueeze(-1).to(e.dtype)
        x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(hidden.to(e.dtype))], dim=-1))
        pos_emb = tuple(t.to(x.device) for t in self._shared["rotary"](x, positions))
        blk = self.block
        attn, _ = blk.self_attn(hidden_states=blk.input_layernorm(x), position_embeddings=pos_emb,
                                attention_mask=mask, position_ids=positions, cache=cache,
                                use_cache=cache is not None)
        x = x + attn
        m = blk.mlp(blk.post_attention_layernorm(x))
        return x + (m[0] if isinstance(m, tuple) else m)

    # ------------------------------------------------------------------ checkpoint layout
    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """Tensors keyed as in a DeepSeek MTP layer (relative to ``model.layers.{N}.``)."""
        return {(k[len("block."):] if k.startswith("block.") else k): v for k, v in self.state_dict().items()}

    def load_checkpoint_state(self, tensors: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        """Copy checkpoint tensors in (strict: every head tensor must be present)."""
        want = self.checkpoint_state()
        missing = sorted(set(want) - set(tensors))
        if missing:
            raise UserError(f"MTP weights in '{source}' are incomplete; missing {len(missing)} tensor(s): "
                            f"{', '.join(missing)}")
        bad = [f"{k} {tuple(tensors[k].shape)} != {tuple(v.shape)}" for k, v in want.items()
               if tuple(tensors[k].shape) != tuple(v.shape)]
        if bad:
            raise UserError(f"MTP weights in '{source}' do not match the target's architecture: "
                            f"{'; '.join(bad)}")
        with torch.no_grad():
            for k, v in want.items():
                v.copy_(tensors[k])


def _fp32_patterns(parts: Any, dtype: torch.dtype) -> list[str]:
    pats = list(parts.keep_in_fp32_strict)
    if dtype == torch.float16:
        pats += list(parts.keep_in_fp32)
    return pats if dtype in (torch.float16, torch.bfloat16) else []


def build_head(parts: Any, spec: MTPSpec, *, device: Any, dtype: torch.dtype,
               tensors: dict[str, torch.Tensor] | None = None, source: str = "checkpoint") -> MTPHead:
    """Build a head for a target (``parts``: its :class:`~specmoe.interfaces.target.TargetParts`): loaded
    from ``tensors`` or freshly initialised.

    The block is created on the meta device first, so a sparse block that is swapped for a dense MLP is never
    allocated. A fresh head uses the target class's own ``_init_weights``; its ``shared_head.norm`` starts as
    a copy of the target's final norm.
    """
    with torch.device("meta"):
        head = MTPHead(block_config(parts.config, spec), spec, parts.decoder_layer_cls, parts.norm_cls)
    head.to_empty(device=device)
    head.to(dtype)
    for name, t in list(head.named_parameters()) + list(head.named_buffers()):
        if any(p in name for p in _fp32_patterns(parts, dtype)):
            t.data = t.data.float()
    if tensors is None:
        for mod in head.modules():
            parts.init_weights(mod)
        if spec.own_norm:
            with torch.no_grad():
                head.shared_head.norm.weight.copy_(parts.final_norm.weight)
    else:
        head.load_checkpoint_state(tensors, source)
    head.bind(parts)
    return head


def depth_mask(depth: int, key_valid: torch.Tensor) -> torch.Tensor:
    """bool ``[B, 1, n, depth * n]``: what slot ``p`` at ``depth`` sees among the keys of depths 1..depth.

    Args:
        key_valid: ``[B, n]`` slots holding a real token.
    """
    b, n = key_valid.shape
    dev = key_valid.device
    p = torch.arange(n, device=dev)[:, None]
    s = torch.arange(n, device=dev)[None, :]
    blocks = [(s <= p - (depth - 1))[None] & key_valid[:, None, :]]
    for j in range(2, depth + 1):
        blocks.append((s == p - (depth - j))[None].expand(b, n, n))
    return torch.cat(blocks, dim=2)[:, None]


def unroll(head: MTPHead, slot_ids: torch.Tensor, hidden: torch.Tensor, key_valid: torch.Tensor,
           depths: int) -> Iterator[torch.Tensor]:
    """The head unrolled over whole sequences (training, teacher-forced node features): yields the block
    output ``o [B, n, H]`` of depths ``1 .. depths``.

    At depth ``d`` the slot at ``p`` takes the head's own depth ``d - 1`` output at slot ``p - 1`` (through
    ``recurse``) instead of ``hidden[:, p]`` and attends as a depth-``d`` tree node does (:func:`depth_mask`),
    so depth ``d``'s output at slot ``p`` proposes token ``p + 2`` as a depth-``d`` node.

    Args:
        slot_ids: ``[B, n]`` token ``p + 1`` of each slot ``p``; hidden: ``[B, n, H]`` the target's final
            normalized hidden states; key_valid: ``[B, n]`` slots holding a real token.
    """
    from transformers import DynamicCache

    from specmoe.interfaces.kv import additive_mask

    bsz, n = slot_ids.shape
    pos = torch.arange(n, device=slot_ids.device).expand(bsz, n)
    cache = DynamicCache() if depths > 1 else None
    h_in = hidden
    for d in range(1, depths + 1):
        o = head(slot_ids, h_in, pos, additive_mask(depth_mask(d, key_valid), head.eh_proj.weight.dtype), cache)
        yield o
        if d < depths:
            rec = head.recurse(o)[:, :-1].to(hidden.dtype)
            h_in = torch.cat([torch.zeros_like(hidden[:, :1]), rec], dim=1)
