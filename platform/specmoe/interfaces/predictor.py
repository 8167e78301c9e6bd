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
    """Predicts a top-K expert set per tree node and MoE layer, as bool ``[B, N, L, E]`` (union: ``|``)."""

    #: analysis-only predictors (e.g. the oracle) must not be counted as a real method's time
    analysis_only: ClassVar[bool] = False
    #: reads :attr:`DraftTree.features`: needs a drafter with ``feature_size > 0``
    uses_draft_features: ClassVar[bool] = False

    @abstractmethod
    def setup(self, target: Target) -> None:
        """Bind to the target (shapes L, E, K; embeddings)."""

    def begin(self, batch_size: int) -> Any:
        """Per-generation state (e.g. the predictor's own KV cache). Default: none."""
        return None

    def observe(self, state: Any, committed: Committed) -> None:
        """Absorb tokens committed since the last call, next root included; once per step before :meth:`predict`."""

    @abstractmethod
    def predict(self, state: Any, tree: DraftTree) -> torch.Tensor:
        """``[B, N, L, E]`` bool predicted experts of every node of ``tree`` (node 0: the last committed token, not
        yet processed by the target); ``state`` is from :meth:`begin`, after :meth:`observe` of all committed."""
