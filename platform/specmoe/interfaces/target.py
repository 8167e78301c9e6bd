# SPDX-License-Identifier: Apache-2.0
"""Target interface: the MoE model whose output speculative decoding must reproduce."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from specmoe.interfaces.kv import KVState
from specmoe.interfaces.plugin import Plugin

__all__ = ["Target", "TargetOutput"]


@dataclass
class TargetOutput:
    """What one target forward pass returns.

    Attributes:
        logits: ``[B, N, V]`` float32 next-token logits at every new position.
        hidden: ``[B, N, F]`` concatenation of the requested hidden states (``None`` if none requested).
        routing: ``[B, N, L, K]`` int64 experts chosen by the target's router at each of the ``L`` MoE
            layers (``None`` unless ``capture_routing``). Padding positions hold whatever the router chose for
            the padding token; mask them with the ``valid`` you passed.
    """

    logits: torch.Tensor
    hidden: torch.Tensor | None = None
    routing: torch.Tensor | None = None


class Target(Plugin, ABC):
    """A causal MoE language model with tree-structured forward passes and routing capture."""

    # ------------------------------------------------------------------ structure
    model: Any
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
    @abstractmethod
    def bytes_per_expert(self) -> int:
        """Bytes of one routed expert's weights in the loaded dtype."""

    @property
    def eos_token_ids(self) -> list[int]:
        return []

    # ------------------------------------------------------------------ compute
    def new_kv(self, batch_size: int) -> KVState:
        """An empty KV state for ``batch_size`` rows."""
        return KVState(batch_size, self.device)

    @abstractmethod
    def forward(self, input_ids: torch.Tensor, kv: KVState, positions: torch.Tensor,
                attend: torch.Tensor | None = None, valid: torch.Tensor | None = None, *,
                hidden_layers: Sequence[int] = (), capture_routing: bool = False) -> TargetOutput:
        """One forward pass over ``N`` new tokens per row, appended to ``kv``.

        Args:
            input_ids: ``[B, N]`` int64.
            kv: cache of committed context (the new slots are appended; prune with ``kv.keep_last``).
            positions: ``[B, N]`` int64 absolute positions (context length + tree depth for tree nodes).
            attend: ``[B, N, N]`` bool new-to-new visibility (ancestor-or-self for a tree); ``None`` = causal.
            valid: ``[B, N]`` bool; ``None`` = all valid.
            hidden_layers: indices into the model's ``hidden_states`` tuple (0 = embeddings, i + 1 = output
                of decoder layer i, -1 = final normalized state) to concatenate into ``TargetOutput.hidden``.
            capture_routing: record the router's top-k choice per token and MoE layer.
        """

    @abstractmethod
    def new_standard_cache(self) -> Any:
        """A cache for :meth:`forward_standard` (the model's own, e.g. with sliding-window layers)."""

    @abstractmethod
    def forward_standard(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor,
                         cache: Any, *, capture_routing: bool = False) -> TargetOutput:
        """The model's own causal forward path (no custom masks): the autoregressive reference.

        Args:
            input_ids: ``[B, N]`` int64 new tokens.
            attention_mask: ``[B, S + N]`` 2D padding mask (1 = real token) over cached and new tokens.
            positions: ``[B, N]`` absolute positions.
            cache: from :meth:`new_standard_cache`; updated in place.
        """

    @abstractmethod
    def routers(self) -> list[torch.nn.Module]:
        """The router module of each MoE layer; calling one on ``[T, H]`` returns a tuple ending in
        the ``[T, K]`` chosen expert indices."""

    @abstractmethod
    def router_inputs_norms(self) -> list[torch.nn.Module]:
        """The normalization applied to the residual stream before each MoE layer's router."""

    @abstractmethod
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[...]`` token ids -> ``[..., H]`` input embeddings (the frozen embedding layer)."""
