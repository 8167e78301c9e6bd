# SPDX-License-Identifier: Apache-2.0
"""Metric declarations; :func:`summarize` computes a cell's own metrics from its :class:`CellData`, :func:`derive`
those relative to the AR cell of the same evaluation group (same prompts, interleaved): speedup, ρ, equality.

:attr:`Metric.aggregate` words: ``steps`` (mean over verification steps; a step of a batch counts once), ``rows``
(mean over (step, active row) pairs), ``batches`` (mean of per-batch values, all turns summed), ``total`` (sum over
the cell), ``prompts`` (fraction of prompts). Across datasets every metric is the mean of per-dataset values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

__all__ = ["Metric", "CellData", "BatchTiming", "METRICS", "register", "get", "names", "summarize", "derive",
           "mean"]

Value = Optional[float]


@dataclass
class BatchTiming:
    """One prompt batch of a cell: new tokens of all its rows and turns, and the seconds they took."""

    new_tokens: int
    seconds: float


@dataclass
class CellData:
    """What a cell's metrics are computed from.

    Attributes:
        steps: step records as dicts (``StepRecord.to_dict()``, one per verification pass), all prompts.
        batches: per prompt batch timing (Spec-Bench: per-question tokens / seconds).
        outputs: generated token ids per sample (turns concatenated), in sample order.
        bytes_per_expert: bytes of one routed expert's weights at the stored precision (with scales).
        bytes_per_expert_loaded: the same as loaded (e.g. MXFP4 dequantized to bf16); 0 when unknown.
    """

    steps: list[dict[str, Any]] = field(default_factory=list)
    batches: list[BatchTiming] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    temperature: float = 0.0
    bytes_per_expert: int = 0
    bytes_per_expert_loaded: int = 0
    num_moe_layers: int = 0


@dataclass(frozen=True)
class Metric:
    """One metric.

    Attributes:
        name: key in results, MLflow and ``platform compare --metric``.
        label: short column label in tables.
        unit: ``x`` (ratio to AR), ``tokens``, ``experts``, ``bytes``, ``s``, ``tokens/s``, ``fraction``, ``count``.
        aggregate: how it aggregates (module docstring).
        compute: ``CellData -> value`` from the cell alone (``None``: no data).
        relative: ``(cell, ar, metrics, ar_metrics) -> value``, from the cell and the AR cell of its group.
        applies_to_ar: False when the AR baseline has no such quantity (shown as "-").
        ar_value: the value shown for AR when it is fixed by definition (speedup 1, α 1).
    """

    name: str
    label: str
    unit: str
    description: str
    aggregate: str
    compute: Optional[Callable[[CellData], Value]] = None
    relative: Optional[Callable[[CellData, CellData, dict[str, float], dict[str, float]], Value]] = None
    applies_to_ar: bool = True
    ar_value: Optional[float] = None

    def format(self, value: Value, time_unit: str = "s") -> str:
        """``value`` as shown in tables (``n/a`` for ``None``); times in ``time_unit`` (``s`` or ``ms``)."""
        if value is None:
            return "n/a"
        if self.unit == "x":
            return f"{value:.2f}x"
        if self.unit == "s":
            if time_unit == "s":
                return f"{value:.3f}s"
            ms = value * 1e3
            return f"{ms:.1f}ms" if abs(ms) >= 100 else f"{ms:.2f}ms" if abs(ms) >= 1 else f"{ms:.3f}ms"
        if self.unit in ("experts", "tokens/s"):
            return f"{value:.1f}"
        if self.unit == "bytes":
            return f"{value / 2**20:.1f}MiB"
        if self.unit == "count":
            return f"{value:.0f}"
        if self.unit == "fraction" and self.name != "matches_ar":
            return f"{value:.3f}"
        return f"{value:.2f}"


#: every registered metric, in registration order (the order of MLflow logging and help texts)
METRICS: dict[str, Metric] = {}


def register(metric: Metric) -> Metric:
    """Add ``metric`` (new name, one of compute / relative); the package registers the built-ins first."""
    if metric.name in METRICS:
        raise ValueError(f"metric '{metric.name}' is registered twice")
    if (metric.compute is None) == (metric.relative is None):
        raise ValueError(f"metric '{metric.name}': give exactly one of compute / relative")
    METRICS[metric.name] = metric
    return metric


def get(name: str) -> Metric:
    if name not in METRICS:
        raise KeyError(f"unknown metric '{name}'; metrics: {', '.join(METRICS)}")
    return METRICS[name]


def names() -> tuple[str, ...]:
    return tuple(METRICS)


def mean(values: Iterable[float]) -> Value:
    vals = list(values)
    return sum(vals) / len(vals) if vals else None


def summarize(data: CellData, autoregressive: bool = False) -> dict[str, float]:
    """Every metric computable from the cell alone (those without data are left out); for the AR cell, those that
    do not apply are left out, or set to their ``ar_value`` when it is fixed."""
    out: dict[str, float] = {}
    for m in METRICS.values():
        if m.compute is None:
            continue
        if autoregressive and not m.applies_to_ar:
            if m.ar_value is not None:
                out[m.name] = m.ar_value
            continue
        value = m.compute(data)
        if value is not None:
            out[m.name] = float(value)
    return out


def derive(cell: CellData, ar: CellData, metrics: dict[str, float], ar_metrics: dict[str, float],
           autoregressive: bool = False) -> dict[str, float]:
    """The metrics relative to ``ar`` (measured on the same prompts in the same run); for the AR cell
    itself only those fixed by definition (``ar_value``)."""
    out: dict[str, float] = {}
    for m in METRICS.values():
        if m.relative is None:
            continue
        if autoregressive:
            if m.ar_value is not None:
                out[m.name] = m.ar_value
            continue
        value = m.relative(cell, ar, metrics, ar_metrics)
        if value is not None:
            out[m.name] = float(value)
    return out
