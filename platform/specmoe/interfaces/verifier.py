# SPDX-License-Identifier: Apache-2.0
"""Verifier interface: how the target's MoE experts are computed during verification.

A verifier plugs into ``transformers`` as an experts implementation (``ExpertsInterface``): the function
receives the experts module, ``hidden [T, H]``, ``top_k_index [T, K]`` and ``top_k_weights [T, K]`` and
returns ``[T, H]`` in the hidden dtype. Verification semantics (acceptance) never change.

A verifier whose computation gives each token the result it gets alone, whatever the other tokens of the pass,
may let the target compile its decoding passes (:meth:`Verifier.compiled_passes`; on CPUs,
``specmoe_plugins.targets.hf.graph``): everything else of a pass is one compiled graph, and the experts are either this
verifier's own call made inside it, or its *graph form* (:meth:`Verifier.graph_experts`), compiled with the
rest.
"""

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
        weights: ``weights() -> tuple of tensors`` that ``forward`` reads, current (rebuilt when the module's own
            weights change); called once per pass, outside the graph.
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
        """``hidden [T, H]``, ``top_k_index [T, K]`` int64, ``top_k_weights [T, K]`` -> ``[T, H]``."""
        raise TypeError(f"{type(self).__name__} uses a built-in implementation and has no experts_forward")

    def compiled_passes(self) -> bool:
        """Whether the target may compile its decoding passes with this verifier (default: no, every pass runs
        eagerly)."""
        return False

    def graph_experts(self, module: torch.nn.Module) -> GraphExperts | None:
        """The graph form of this verifier's computation for the experts module ``module``; ``None`` (the
        default): a compiled pass calls the module as it is, an opaque step inside the graph."""
        return None

    def install(self, target: Target) -> None:
        """Switch every MoE layer of ``target`` (a :class:`~specmoe.interfaces.target.Target`) to this
        verifier's implementation, with compiled decoding passes where :meth:`compiled_passes` says so."""
        if type(self).experts_forward is not Verifier.experts_forward:
            self.register()
        target.set_experts_implementation(self.implementation_name())
        target.compile_passes(self if self.compiled_passes() else None)
