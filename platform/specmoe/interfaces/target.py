# SPDX-License-Identifier: Apache-2.0
"""Target interface: the MoE model whose output speculative decoding must reproduce.

Everything the engine, the drafters, the predictors, the verifiers and the training stages need from a
target is on :class:`Target`; none of them reaches into the model object behind it.
"""

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
        logits: ``[B, N, V]`` float32 next-token logits at every new position (``None`` when the caller asked
            for none: ``compute_logits=False``).
        hidden: ``[B, N, F]`` concatenation of the requested hidden states (``None`` if none requested).
        routing: ``[B, N, L, K]`` int64 experts chosen by the target's router at each of the ``L`` MoE
            layers (``None`` unless ``capture_routing``). Padding positions hold whatever the router chose for
            the padding token; mask them with the ``valid`` you passed.
    """

    logits: torch.Tensor | None
    hidden: torch.Tensor | None = None
    routing: torch.Tensor | None = None


@dataclass
class TargetParts:
    """The target network's own building blocks, for drafters built from the target's architecture (an MTP
    head is one more decoder layer of the target's kind over the target's embedding, final norm and LM head).

    Attributes:
        config: the architecture configuration (a ``transformers.PretrainedConfig`` for Hugging Face models):
            sizes, attention heads, MLP width, norm epsilon, RoPE settings. ``config.to_dict()`` is JSON-able.
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
    """A causal MoE language model with tree-structured forward passes and routing capture.

    Every implementation's :meth:`forward` and :meth:`forward_standard` check their arguments first (shapes
    and dtypes against ``input_ids`` and the KV state; :mod:`specmoe.interfaces.checks`).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        checked_method(cls, "forward", check_forward)
        checked_method(cls, "forward_standard", check_forward_standard)

    # ------------------------------------------------------------------ structure
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

    # Optional capabilities below carry defaults; a target overrides them where it knows better.
    @property
    def bytes_per_expert(self) -> int:
        """Bytes of one routed expert's weights (and biases) as loaded, in the dtype the model runs in. Default:
        the parameters of the first MoE layer's experts module over :attr:`num_experts`."""
        mod = self.experts_modules()[0]
        return sum(p.numel() * p.element_size() for p in mod.parameters()) // max(1, self.num_experts)

    @property
    def bytes_per_expert_stored(self) -> int:
        """Bytes of one routed expert's weights (and biases) at the checkpoint's stored precision (MXFP4 with
        its scales, FP8 with its block scales, bf16...): the size the paper's Fig. 1c and Table 2 count. Default:
        :attr:`bytes_per_expert` (stored as loaded)."""
        return self.bytes_per_expert

    @property
    def expert_storage(self) -> str:
        """A short description of how the checkpoint stores the experts (e.g. ``mxfp4: 4-bit e2m1 weights +
        one e8m0 byte scale per 32 weights``). Default: the loaded dtype."""
        return f"{str(self.dtype).removeprefix('torch.')} weights, as loaded"

    @property
    def eos_token_ids(self) -> list[int]:
        return []

    @abstractmethod
    def to(self, device: torch.device | str) -> None:
        """Move the model to ``device`` (a no-op for a model spread over devices by a device map)."""

    # ------------------------------------------------------------------ compute
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
        """One forward pass over ``N`` new tokens per row, appended to ``kv``.

        Every returned tensor is on :attr:`device` (a target spread over several devices moves what crosses
        layers there once per pass).

        Args:
            input_ids: ``[B, N]`` int64.
            kv: cache of committed context (the new slots are appended; prune with ``kv.keep_last``).
            positions: ``[B, N]`` int64 absolute positions (context length + tree depth for tree nodes).
            attend: ``[B, N, N]`` bool new-to-new visibility (ancestor-or-self for a tree); ``None`` = causal.
            valid: ``[B, N]`` bool; ``None`` = all valid.
            hidden_layers: indices into the model's ``hidden_states`` tuple (0 = embeddings, i + 1 = output
                of decoder layer i, -1 = final normalized state) to concatenate into ``TargetOutput.hidden``.
            capture_routing: record the router's top-k choice per token and MoE layer.
            cached_attend: ``[B, N, S]`` bool extra restriction on the ``S`` cached slots (a drafter that keeps
                uncommitted tree nodes in the cache lets each node see only its own ancestors).
            logits_at: ``[B, P]`` int64 indices into the ``N`` new tokens: compute logits only there
                (``TargetOutput.logits`` is then ``[B, P, V]``; a prompt pass needs only each row's last one).
        """

    @abstractmethod
    def new_standard_cache(self) -> Any:
        """A cache for :meth:`forward_standard` (the model's own, e.g. with sliding-window layers)."""

    @abstractmethod
    def forward_standard(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, positions: torch.Tensor,
                         cache: Any = None, *, hidden_layers: Sequence[int] = (), capture_routing: bool = False,
                         compute_logits: bool = True, logits_to_keep: int = 0) -> TargetOutput:
        """The model's own causal forward path (no custom masks): the autoregressive reference, and the
        teacher pass of training stages (full sequences, ``cache=None``).

        Args:
            input_ids: ``[B, N]`` int64 new tokens.
            attention_mask: ``[B, S + N]`` 2D padding mask (1 = real token) over cached and new tokens; ``None``:
                no padding.
            positions: ``[B, N]`` absolute positions.
            cache: from :meth:`new_standard_cache`, updated in place; ``None``: no cache (one whole pass).
            hidden_layers: as in :meth:`forward`.
            capture_routing: as in :meth:`forward`.
            compute_logits: ``False`` skips the LM head (``logits`` is ``None``; saves the ``[B, N, V]`` tensor
                when only routing or hidden states are wanted).
            logits_to_keep: ``k > 0`` computes logits for the last ``k`` positions only (``[B, k, V]``; a
                left-padded prompt pass needs only the last); 0: every position.
        """

    # ------------------------------------------------------------------ modules
    @abstractmethod
    def routers(self) -> list[torch.nn.Module]:
        """The router module of each MoE layer; calling one on ``[T, H]`` returns a tuple ending in
        the ``[T, K]`` chosen expert indices."""

    def router_inputs_norms(self) -> list[torch.nn.Module]:
        """The normalization applied to the residual stream before each MoE layer's router. Optional: only what
        runs the routers outside the model reads it (a predictor that routes token embeddings, the dense-bytes
        roofline); the default says the target does not expose it."""
        raise NotImplementedError(f"target {type(self).__name__} does not expose the norms before its routers "
                                  f"(Target.router_inputs_norms), which routing outside the model needs")

    @abstractmethod
    def experts_modules(self) -> list[torch.nn.Module]:
        """The experts module of each MoE layer: ``module(hidden [T, H], top_k_index [T, K],
        top_k_weights [T, K]) -> [T, H]``."""

    @abstractmethod
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[...]`` token ids -> ``[..., H]`` input embeddings (the frozen embedding layer)."""

    @property
    @abstractmethod
    def experts_implementation(self) -> str:
        """The name of the experts implementation the MoE layers run now (``eager``...)."""

    @abstractmethod
    def set_experts_implementation(self, name: str) -> None:
        """Switch every MoE layer to the experts implementation registered under ``name`` (what a
        :class:`~specmoe.interfaces.verifier.Verifier` installs)."""

    def compile_passes(self, verifier: Any) -> None:
        """Optional: run the decoding passes (autoregressive steps, verification) as one compiled graph with
        the installed :class:`~specmoe.interfaces.verifier.Verifier` (its ``graph_experts`` where it has them),
        where the target can; ``None``: every pass eager. The default ignores it."""

    def parts(self) -> TargetParts:
        """The network's building blocks (see :class:`TargetParts`); targets that cannot expose them say so."""
        raise NotImplementedError(f"target {type(self).__name__} does not expose its network parts, so drafters "
                                  f"built from the target's architecture (mtp) cannot use it")

    def native_generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor | None:
        """Greedy generation by the model library's own loop (``transformers``' ``generate``), ``[B, N + M]``;
        benchmarks compare the engine's autoregressive loop against it. ``None`` where there is none."""
        return None
