# SPDX-License-Identifier: Apache-2.0
"""Verifier interface: how the target's MoE experts are computed during verification (a ``transformers`` experts
implementation, :meth:`Verifier.experts_forward`); acceptance never changes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from specmoe.interfaces.plugin import Plugin

if TYPE_CHECKING:
    from specmoe.interfaces.target import Target

__all__ = ["Verifier", "GraphExperts"]


@dataclass(frozen=True)
class GraphExperts:
    """One MoE layer's experts computation in a form a compiler traces into a decoding pass.

    Attributes:
        forward: ``forward(weights, hidden [T, H], top_k_index [T, K] int64, top_k_weights [T, K]) -> [T, H]``
            in the hidden dtype: a pure function of tensors (no host reads, no data-dependent shapes, no side
            effects) that gives each token the result it gets alone, whatever ``T``.
        weights: ``weights()`` -> the current tensors ``forward`` reads; called once per pass, outside the graph.
    """

    forward: Callable[..., torch.Tensor]
    weights: Callable[[], tuple]


class Verifier(Plugin, ABC):
    """Selects the experts computation of a target's MoE layers."""

    @abstractmethod
    def implementation_name(self) -> str:
        """The ``transformers`` experts-implementation name to switch the target to."""

    def register(self) -> None:
        """Register :meth:`experts_forward` with ``transformers`` under :meth:`implementation_name`."""
        from transformers.integrations.moe import ExpertsInterface

        name = self.implementation_name()
        fn = self.experts_forward

        def experts_fn(module: torch.nn.Module, hidden: torch.Tensor, top_k_index: torch.Tensor,
                       top_k_weights: torch.Tensor) -> torch.Tensor:
            return fn(module, hidden, top_k_index, top_k_weights)

        ExpertsInterface.register(name, experts_fn)

    def experts_forward(self, module: torch.nn.Module, hidden: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
        """``hidden [T, H]``, ``top_k_index [T, K]`` int64, ``top_k_weights [T, K]`` -> ``[T, H]`` (hidden dtype)."""
        raise TypeError(f"{type(self).__name__} uses a built-in implementation and has no experts_forward")

    def compiled_passes(self) -> bool:
        """Whether the target may compile its decoding passes with this verifier (default: no); only for a
        computation that gives each token the result it gets alone."""
        return False

    def graph_experts(self, module: torch.nn.Module) -> GraphExperts | None:
        """The graph form of this computation for ``module``; ``None`` (default): compiled passes call it opaquely."""
        return None

    def install(self, target: Target) -> None:
        """Switch every MoE layer of ``target`` to this implementation (compiled passes per :meth:`compiled_passes`)."""
        if type(self).experts_forward is not Verifier.experts_forward:
            self.register()
        target.set_experts_implementation(self.implementation_name())
        target.compile_passes(self if self.compiled_passes() else None)
