# SPDX-License-Identifier: Apache-2.0
"""Per-step records and per-generation results, with Spec-Bench metric definitions."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["StepRecord", "Generation", "summarize"]


@dataclass
class StepRecord:
    """One decoding step (one target verification pass) for a batch.

    Attributes:
        accepted: tokens appended per active row this step (accepted drafts + bonus; 1 for AR).
        verified: tokens the target processed per active row (selected nodes, root included).
        experts_per_layer: unique experts activated in the verification pass, per MoE layer (across the
            batch), from the target's router hooks.
        predicted_per_layer: unique experts predicted for the verified nodes, per MoE layer (None without a
            predictor).
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


def summarize(gens: list[Generation], bytes_per_expert: int, num_moe_layers: int,
              bytes_per_expert_loaded: int | None = None) -> dict[str, float]:
    """Aggregate metrics over generations.

    * ``alpha``: mean over steps and rows of tokens appended per step (Spec-Bench: bonus included).
    * ``E``: mean unique experts per MoE layer per verification step.
    * ``tokens_per_s``: mean over generations of (new tokens / wall time) (Spec-Bench per-question tok/s).
    * ``expert_bytes_per_step``: E x MoE layers x ``bytes_per_expert``, the bytes of one routed expert at the
      checkpoint's stored precision (``Target.bytes_per_expert_stored``): the paper's Table 2 estimate counts
      experts at that precision (Fig. 1c: 12.45 MB MXFP4, 37.75 MB bf16, 44.04 MB FP8).
    * ``expert_bytes_per_step_loaded``: the same at the loaded precision (``Target.bytes_per_expert``), what a
      pass that dequantized the experts on load reads; only when ``bytes_per_expert_loaded`` is given.
    """
    steps = [s for g in gens for s in g.steps]
    acc = [a for s in steps for a in s.accepted]
    n = max(len(steps), 1)
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    e = mean([s.unique_experts for s in steps])
    pred = [s.predicted_experts for s in steps if s.predicted_experts is not None]
    tps = [sum(len(t) for t in g.tokens) / g.wall_time for g in gens if g.wall_time > 0]
    out = {
        "alpha": mean(acc),
        "E": e,
        "tokens_per_s": mean(tps),
        "expert_bytes_per_step": e * num_moe_layers * bytes_per_expert,
        "t_draft": sum(s.t_draft for s in steps) / n,
        "t_pred": sum(s.t_pred for s in steps) / n,
        "t_select": sum(s.t_select for s in steps) / n,
        "t_verify": sum(s.t_verify for s in steps) / n,
        "t_total": sum(s.t_total for s in steps) / n,
        "steps": float(len(steps)),
        "new_tokens": float(sum(len(t) for g in gens for t in g.tokens)),
    }
    if bytes_per_expert_loaded is not None:
        out["expert_bytes_per_step_loaded"] = e * num_moe_layers * bytes_per_expert_loaded
    if pred:
        out["E_pred"] = mean(pred)
    total = sum(s.pred_total for s in steps)
    if total:
        out["predictor_accuracy"] = sum(s.pred_hits for s in steps) / total
    return out
