# SPDX-License-Identifier: Apache-2.0
"""Expert predictor interface: which experts each draft-tree node will route to, per MoE layer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from specmoe.interfaces.drafter import Committed
from specmoe.interfaces.plugin import Plugin
from specmoe.interfaces.tree import DraftTree

__all__ = ["Predictor"]


class Predictor(Plugin, ABC):
    """Predicts a top-K expert set per tree node and MoE layer.

    Expert sets are boolean ``[B, N, L, E]`` tensors so that unions are ``|`` and marginal costs are sums.
    """

    #: analysis-only predictors (e.g. the oracle) must not be counted as a real method's time
    analysis_only: ClassVar[bool] = False

    @abstractmethod
    def setup(self, target: Any) -> None:
        """Bind to the target (shapes L, E, K; embeddings)."""

    def begin(self, batch_size: int) -> Any:
        """Per-generation state (e.g. the predictor's own KV cache). Default: none."""
        return None

    def observe(self, state: Any, committed: Committed) -> None:
        """Absorb tokens committed since the last call (context for the next prediction). Default: ignore."""

    @abstractmethod
    def predict(self, state: Any, tree: DraftTree, target_kv: Any = None) -> torch.Tensor:
        """Return ``[B, N, L, E]`` bool: predicted experts of every node of ``tree`` (root included).

        Args:
            state: from :meth:`begin`.
            tree: the candidate pool.
            target_kv: the target's committed KV state (only the oracle uses it, and must leave it unchanged).
        """
