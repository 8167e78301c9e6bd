# SPDX-License-Identifier: Apache-2.0
"""Expert predictor interface: which experts each draft-tree node will route to, per MoE layer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from specmoe.interfaces.drafter import Committed
from specmoe.interfaces.plugin import Plugin
from specmoe.interfaces.tree import DraftTree

if TYPE_CHECKING:
    from specmoe.interfaces.target import Target

__all__ = ["Predictor"]


class Predictor(Plugin, ABC):
    """Predicts a top-K expert set per tree node and MoE layer.

    Expert sets are boolean ``[B, N, L, E]`` tensors so that unions are ``|`` and marginal costs are sums.
    """

    #: analysis-only predictors (e.g. the oracle) must not be counted as a real method's time
    analysis_only: ClassVar[bool] = False
    #: reads the drafter's per-node features (:attr:`DraftTree.features`): needs a drafter that attaches them
    #: (``Drafter.feature_size > 0``)
    uses_draft_features: ClassVar[bool] = False

    @abstractmethod
    def setup(self, target: Target) -> None:
        """Bind to the target (shapes L, E, K; embeddings)."""

    def begin(self, batch_size: int) -> Any:
        """Per-generation state (e.g. the predictor's own KV cache). Default: none."""
        return None

    def observe(self, state: Any, committed: Committed) -> None:
        """Absorb tokens committed since the last call (context for the next prediction), the next tree's
        root included. Called once per step before :meth:`predict`. Default: ignore."""

    @abstractmethod
    def predict(self, state: Any, tree: DraftTree) -> torch.Tensor:
        """Return ``[B, N, L, E]`` bool: predicted experts of every node of ``tree`` (root included).

        Args:
            state: from :meth:`begin`, after :meth:`observe` of everything committed so far.
            tree: the candidate pool (node 0 is the last committed token, which the target has not processed
                yet).
        """
