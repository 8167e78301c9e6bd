# SPDX-License-Identifier: Apache-2.0
"""Per-step records and per-generation results (plain data; metrics live in :mod:`specmoe.metrics`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["StepRecord", "Generation"]


@dataclass
class StepRecord:
    """One decoding step (one target verification pass) for a batch.

    Attributes:
        accepted: tokens appended per active row this step (accepted drafts + bonus; 1 for AR).
        verified: tokens the target processed per active row (selected nodes, root included).
        experts_per_layer: unique experts activated by the verified tokens, per MoE layer (across the
            batch; padding and finished rows excluded), from the target's router hooks.
        pass_experts_per_layer: unique experts per MoE layer over every token of the pass, padding and finished
            rows included (``None`` when not recorded).
        predicted_per_layer: unique experts predicted for the verified nodes, per MoE layer (None: no predictor).
        t_draft, t_pred, t_select, t_verify, t_total: seconds (t_total includes acceptance and cache upkeep).
        cumulative_experts: E (mean over layers of unique experts, union over the batch) after the first
            k = 1..M verified tokens of each row, in tree order (paper Fig. 1b).
    """

    accepted: list[int]
    verified: list[int]
    experts_per_layer: list[int]
    predicted_per_layer: list[int] | None = None
    t_draft: float = 0.0
    t_pred: float = 0.0
    t_select: float = 0.0
    t_verify: float = 0.0
    t_total: float = 0.0
    cumulative_experts: list[float] | None = None
    pred_hits: int = 0
    """sum over verified tokens and MoE layers of |predicted top-K  &  router's top-K| (0 without predictor)."""
    pred_total: int = 0
    """verified tokens x MoE layers x K: ``pred_hits / pred_total`` is the top-K overlap accuracy."""
    pass_experts_per_layer: list[int] | None = None
    speculative: bool = True
    """False for a plain AR step the engine took under its AR floor (no drafting, prediction or selection)."""
    uncut: list[int] | None = None
    """per active row, the tokens acceptance produced (accepted drafts + bonus) before stop rules cut them
    (``accepted`` where no rule cut; ``None`` for AR steps)."""

    @property
    def unique_experts(self) -> float:
        """E: mean over MoE layers of the unique experts in this verification pass."""
        return sum(self.experts_per_layer) / max(len(self.experts_per_layer), 1)

    @property
    def predicted_experts(self) -> float | None:
        if self.predicted_per_layer is None:
            return None
        return sum(self.predicted_per_layer) / max(len(self.predicted_per_layer), 1)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["unique_experts"] = self.unique_experts
        d["predicted_experts"] = self.predicted_experts
        return d


@dataclass
class Generation:
    """The output of one batch generation.

    Attributes:
        tokens: generated token ids per row (prompt excluded; truncated at stop rules).
        steps: per-step records (the prefill pass is not a step).
        wall_time: seconds from the first forward pass to the end, per batch.
        prefill_time: seconds spent in the prompt pass.
        expert_counts: ``[L][E]`` how often each expert was activated by verified tokens (paper Fig. 4).
    """

    tokens: list[list[int]]
    steps: list[StepRecord] = field(default_factory=list)
    wall_time: float = 0.0
    prefill_time: float = 0.0
    expert_counts: list[list[int]] | None = None
