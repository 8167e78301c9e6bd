# SPDX-License-Identifier: Apache-2.0
"""One result type for an evaluation cell (a method on a dataset at one temperature, γ, batch size); the
evaluation fills every field, ``platform compare`` rebuilds cells from MLflow runs without the bulky ones."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from specmoe.evaluation.stats import Interval

__all__ = ["CellResult"]

#: fields too large for ``results.json`` and MLflow params (kept in the cache and as artifacts)
BULKY = ("per_sample", "outputs", "steps", "expert_counts", "calibration", "batches")


@dataclass
class CellResult:
    """An evaluation cell.

    Attributes:
        method, dataset, temperature, budget, batch_size: the cell's coordinates (``budget`` is γ; 1 for AR).
        metrics: metric name -> value (names from :mod:`specmoe.metrics`).
        autoregressive / analysis_only: the AR baseline of its group / never a real speedup (e.g. oracle sets).
        key / run_id / parent: its evaluation group (cache key), its MLflow run and the recipe (parent) run.
        order: position in the run (``platform compare``: MLflow start time); later wins on repeats.
        cached: read back from the evaluation cache instead of measured now.
        per_sample: ``{"id", "new_tokens", "seconds", "batch_tokens_per_s"}`` per sample.
        outputs: ``{"id", "turns" (text), "tokens" (ids per turn)}`` per sample.
        steps: step records (``StepRecord.to_dict()``).
        expert_counts: ``[L][E]`` activations of verified tokens (paper Fig. 4); ``None`` for AR.
        adaptive: the selector is adaptive (e.g. ``goodput``); compared with the best fixed-γ method of the cell.
        calibration: the adaptive selector's models (and AR floor decisions) after the last batch; else ``None``.
        batches: per prompt batch, in order: ``{"new_tokens", "seconds", "values": {metric: [value, weight]}}``
            (and ``"round_seconds"``; :func:`specmoe.evaluation.cell.batch_summary`), the input of intervals.
        intervals: metric -> ``[lo, hi]`` at :data:`~specmoe.evaluation.stats.LEVEL`; absent with too few batches.
        prompt_batches: prompt batches the cell was measured on.
    """

    method: str
    dataset: str
    temperature: float
    budget: int
    batch_size: int
    metrics: dict[str, float] = field(default_factory=dict)
    autoregressive: bool = False
    analysis_only: bool = False
    key: str = ""
    run_id: str = ""
    parent: str = ""
    order: int = 0
    cached: bool = False
    per_sample: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    expert_counts: Optional[list[list[int]]] = None
    adaptive: bool = False
    calibration: Optional[dict[str, Any]] = None
    batches: list[dict[str, Any]] = field(default_factory=list)
    intervals: dict[str, list[float]] = field(default_factory=dict)
    prompt_batches: int = 0

    def interval(self, metric: str) -> Optional[Interval]:
        """``metric`` as an :class:`~specmoe.evaluation.stats.Interval` (``None`` when the cell lacks it)."""
        from specmoe.evaluation.stats import Interval

        if metric not in self.metrics:
            return None
        lo, hi = self.intervals.get(metric, (None, None))
        return Interval(self.metrics[metric], lo, hi, n=self.prompt_batches)

    @property
    def label(self) -> str:
        """``ecospec / gsm8k / T=0.0 / γ=4 / bs=1``."""
        gamma = "" if self.autoregressive else f" / γ={self.budget}"
        return f"{self.method} / {self.dataset} / T={self.temperature}{gamma} / bs={self.batch_size}"

    @property
    def setting(self) -> tuple[float, int]:
        """(temperature, batch size): the cells that share one AR measurement per dataset."""
        return self.temperature, self.batch_size

    def to_json(self, bulky: bool = True) -> dict[str, Any]:
        """JSON-able dict (without the bulky per-sample data when ``bulky`` is False)."""
        d = asdict(self)
        if not bulky:
            for k in BULKY:
                d.pop(k)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CellResult":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
