# SPDX-License-Identifier: Apache-2.0
"""Target interface: the MoE model whose output speculative decoding must reproduce."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from specmoe.interfaces.checks import check_count, check_forward, check_forward_standard, checked_method
from specmoe.interfaces.kv import KVState
from specmoe.interfaces.plugin import Plugin

__all__ = ["Target", "TargetOutput", "TargetParts"]


@dataclass
class TargetOutput:
    """What one target forward pass returns.

    Attributes:
        logits: ``[B, N, V]`` float32 next-token logits per new position (``None``: ``compute_logits=False``).
        hidden: ``[B, N, F]`` concatenation of the requested hidden states (``None`` if none requested).
        routing: ``[B, N, L, K]`` int64 router-chosen experts per MoE layer (``None`` unless ``capture_routing``);
            padding positions hold the padding token's choice: mask them with ``valid``.
    """

    logits: torch.Tensor | None
    hidden: torch.Tensor | None = None
    routing: torch.Tensor | None = None


@dataclass
class TargetParts:
    """The target network's building blocks, for drafters built from its architecture (e.g. an MTP head).

    Attributes:
        config: the architecture config (``transformers.PretrainedConfig`` for HF; ``to_dict()`` is JSON-able).
        embed_tokens: ``[...]`` token ids -> ``[..., H]`` input embeddings (``.weight`` is ``[V, H]``; frozen).
        lm_head: ``[..., H]`` -> ``[..., V]`` logits (``.weight`` is ``[V, H]``).
        final_norm: ``[..., H]`` -> ``[..., H]``, the norm applied before ``lm_head``.
        rotary_emb: ``(x [B, N, H], positions [B, N])`` -> ``(cos, sin)`` position embeddings of the layers.
        decoder_layer_cls: ``decoder_layer_cls(config, layer_idx)`` builds one decoder layer of the target's
            kind (``input_layernorm``, ``self_attn``, ``post_attention_layernorm``, ``mlp``).
        norm_cls: ``norm_cls(size, eps=...)`` builds the target's RMSNorm.
        init_weights: the architecture's weight initialisation, applied to one module.
        keep_in_fp32: parameter-name patterns the architecture keeps in float32 when loaded in float16.
        keep_in_fp32_strict: patterns kept in float32 in float16 and bfloat16.
    """

    config: Any
    embed_tokens: torch.nn.Module
    lm_head: torch.nn.Module
    final_norm: torch.nn.Module
    rotary_emb: torch.nn.Module
    decoder_layer_cls: type
    norm_cls: type
    init_weights: Callable[[torch.nn.Module], None]
    keep_in_fp32: list[str] = field(default_factory=list)
    keep_in_fp32_strict: list[str] = field(default_factory=list)


class Target(Plugin, ABC):
    """A causal MoE LM with tree passes and routing capture; ``forward`` / ``forward_standard`` check arguments."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        checked_method(cls, "forward", check_forward)
        checked_method(cls, "forward_standard", check_forward_standard)

    #: the tokenizer (``encode`` / ``decode`` / ``apply_chat_template``), or ``None`` for tokenizer-less models
    tokenizer: Any
    #: local checkpoint directory or hub id the model was loaded from (drafters such as MTP default to it)
    path: str

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @property
    @abstractmethod
    def dtype(self) -> torch.dtype: ...

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abstractmethod
    def num_hidden_layers(self) -> int: ...

    @property
    @abstractmethod
    def hidden_size(self) -> int: ...

    @property
    @abstractmethod
    def moe_layer_ids(self) -> list[int]:
        """Decoder-layer indices of the ``L`` MoE layers, in order."""

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layer_ids)

    @property
    @abstractmethod
    def num_experts(self) -> int:
        """Routed experts per MoE layer (``E``)."""

    @property
    @abstractmethod
    def top_k(self) -> int:
        """Experts chosen per token per MoE layer (``K``)."""

    @property
    def bytes_per_expert(self) -> int:
        """Bytes of one routed expert's weights (and biases) as loaded. Default: from the first MoE layer."""
        mod = self.experts_modules()[0]
        return sum(p.numel() * p.element_size() for p in mod.parameters()) // max(1, self.num_experts)

    @property
    def bytes_per_expert_stored(self) -> int:
        """Bytes of one routed expert at the checkpoint's stored precision. Default: :attr:`bytes_per_expert`."""
        return self.bytes_per_expert

    @property
    def expert_storage(self) -> str:
        """How the checkpoint stores the experts, in a few words. Default: the loaded dtype."""
        return f"{str(self.dtype).removeprefix('torch.')} weights, as loaded"

    @property
    def eos_token_ids(self) -> list[int]:
        return []

    @abstractmethod
    def to(self, device: torch.device | str) -> None:
        """Move the model to ``device`` (a no-op for a model spread over devices by a device map)."""

    def new_kv(self, batch_size: int, capacity: int = 0) -> KVState:
        """An empty KV state for ``batch_size`` rows, preallocated for ``capacity`` slots per row."""
        check_count(f"{type(self).__name__}.new_kv", "batch_size", batch_size)
        check_count(f"{type(self).__name__}.new_kv", "capacity", capacity, low=0)
        return KVState(batch_size, self.device, capacity)

    @abstractmethod
    def forward(self, input_ids: torch.Tensor, kv: KVState, positions: torch.Tensor,
                attend: torch.Tensor | None = None, valid: torch.Tensor | None = None, *,
                hidden_layers: Sequence[int] = (), capture_routing: bool = False,
                cached_attend: torch.Tensor | None = None, logits_at: torch.Tensor | None = None) -> TargetOutput:
        """One forward pass over ``N`` new tokens per row, appended to ``kv``; every output is on :attr:`device`.

        Args:
            input_ids: ``[B, N]`` int64.
            kv: cache of committed context (the new slots are appended; prune with ``kv.keep_last``).
            positions: ``[B, N]`` int64 absolute positions (context length + tree depth for tree nodes).
            attend: ``[B, N, N]`` bool new-to-new visibility (ancestor-or-self for a tree); ``None`` = causal.
            valid: ``[B, N]`` bool; ``None`` = all valid.
            hidden_layers: indices into the model's ``hidden_states`` tuple (0 = embeddings, i + 1 = output
                of decoder layer i, -1 = final normalized state) to concatenate into ``TargetOutput.hidden``.
            capture_routing: record the router's top-k choice per token and MoE layer.
            cached_attend: ``[B, N, S]`` bool extra restriction on the ``S`` cached slots.
            logits_at: ``[B, P]`` int64 indices into the ``N`` new tokens: logits only there (``[B, P, V]``).
        """

    @abstractmethod
    def new_standard_cache(self) -> Any:
        """A cache for :meth:`forward_standard` (the model's own, e.g. with sliding-window layers)."""

    @abstractmethod
    def forward_standard(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, positions: torch.Tensor,
                         cache: Any = None, *, hidden_layers: Sequence[int] = (), capture_routing: bool = False,
                         compute_logits: bool = True, logits_to_keep: int = 0) -> TargetOutput:
        """The model's own causal forward (no custom masks): the AR reference and the training teacher pass.

        Args:
            input_ids, positions: ``[B, N]`` int64 new tokens and their absolute positions.
            attention_mask: ``[B, S + N]`` padding mask (1 = real token) over cached and new tokens, or ``None``.
            cache: from :meth:`new_standard_cache`, updated in place; ``None``: no cache (one whole pass).
            hidden_layers, capture_routing: as in :meth:`forward`.
            compute_logits: ``False`` skips the LM head (``logits`` is ``None``).
            logits_to_keep: ``k > 0``: logits for the last ``k`` positions only (``[B, k, V]``); 0: all.
        """

    @abstractmethod
    def routers(self) -> list[torch.nn.Module]:
        """Each MoE layer's router: ``router(x [T, H])`` returns a tuple ending in ``[T, K]`` expert indices."""

    def router_inputs_norms(self) -> list[torch.nn.Module]:
        """The norm before each MoE layer's router (optional; needed only to run routers outside the model)."""
        raise NotImplementedError(f"target {type(self).__name__} does not expose the norms before its routers "
                                  f"(Target.router_inputs_norms), which routing outside the model needs")

    @abstractmethod
    def experts_modules(self) -> list[torch.nn.Module]:
        """Each MoE layer's experts: ``(hidden [T, H], top_k_index [T, K], top_k_weights [T, K]) -> [T, H]``."""

    @abstractmethod
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[...]`` token ids -> ``[..., H]`` input embeddings (the frozen embedding layer)."""

    @property
    @abstractmethod
    def experts_implementation(self) -> str:
        """The name of the experts implementation the MoE layers run now (``eager``...)."""

    @abstractmethod
    def set_experts_implementation(self, name: str) -> None:
        """Switch every MoE layer to the experts implementation registered under ``name``."""

    def compile_passes(self, verifier: Any) -> None:
        """Optional: compile decoding passes with ``verifier`` (``None``: all eager). The default ignores it."""

    def parts(self) -> TargetParts:
        """The network's building blocks (see :class:`TargetParts`); targets that cannot expose them say so."""
        raise NotImplementedError(f"target {type(self).__name__} does not expose its network parts, so drafters "
                                  f"built from the target's architecture (mtp) cannot use it")

    def native_generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor | None:
        """``[B, N + M]`` greedy generation by the library's own loop (benchmark reference), or ``None``."""
        return None
