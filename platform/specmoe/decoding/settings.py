# SPDX-License-Identifier: Apache-2.0
"""How one generation decodes, as one typed value from the recipe to the engine."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from specmoe.decoding.stopping import StopRule

__all__ = ["DecodeSettings"]


@dataclass(frozen=True)
class DecodeSettings:
    """The decoding settings of one generation call.

    Attributes:
        budget: verified tokens per speculative step, the root included (γ; 1 for autoregressive decoding).
        steps: draft levels per step (tree depth).
        top_k: children per expanded draft node.
        temperature: 0 = greedy; > 0 samples from the target distribution.
        stop: the stop rule (``max_new_tokens``, stop ids / strings).
        seed: seeds sampling.
    """

    budget: int
    steps: int
    top_k: int
    temperature: float
    stop: StopRule
    seed: int = 0

    def replace(self, **changes: Any) -> DecodeSettings:
        """A copy with ``changes`` (e.g. ``seed=``, ``budget=``)."""
        return dataclasses.replace(self, **changes)

    def engine_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :meth:`~specmoe.decoding.engine.SpeculativeEngine.generate`."""
        return {"budget": self.budget, "steps": self.steps, "top_k": self.top_k, "temperature": self.temperature,
                "stop": self.stop, "seed": self.seed}
