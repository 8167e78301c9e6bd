# SPDX-License-Identifier: Apache-2.0
"""Verifier interface: how the target's MoE experts are computed during verification.

A verifier plugs into ``transformers`` as an experts implementation (``ExpertsInterface``): the function
receives the experts module, ``hidden [T, H]``, ``top_k_index [T, K]`` and ``top_k_weights [T, K]`` and
returns ``[T, H]`` in the hidden dtype. Verification semantics (acceptance) never change.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from specmoe.interfaces.plugin import Plugin

__all__ = ["Verifier"]


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

        def experts_fn(module: Any, hidden: torch.Tensor, top_k_index: torch.Tensor,
                       top_k_weights: torch.Tensor) -> torch.Tensor:
            return fn(module, hidden, top_k_index, top_k_weights)

        ExpertsInterface.register(name, experts_fn)

    def experts_forward(self, module: Any, hidden: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
        """``hidden [T, H]``, ``top_k_index [T, K]`` int64, ``top_k_weights [T, K]`` -> ``[T, H]``."""
        raise TypeError(f"{type(self).__name__} uses a built-in implementation and has no experts_forward")

    def install(self, target: Any) -> None:
        """Switch every MoE layer of ``target`` (a :class:`~specmoe.interfaces.target.Target`) to this
        verifier's implementation."""
        if type(self).experts_forward is not Verifier.experts_forward:
            self.register()
        target.set_experts_implementation(self.implementation_name())
