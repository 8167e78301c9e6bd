# SPDX-License-Identifier: Apache-2.0
"""One prompt batch of one method (:func:`run_batch`: a JSON-able record), and a cell built from its batches.

Multi-turn samples generate each turn after the previous answer; new tokens sum all turns.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any, Callable, Sequence

from specmoe.decoding.settings import DecodeSettings
from specmoe.evaluation.results import CellResult
from specmoe.interfaces.dataset import Sample
from specmoe.metrics import BatchTiming, CellData, summarize

if TYPE_CHECKING:
    from specmoe.evaluation.method import Method
    from specmoe.metrics import Metric

__all__ = ["run_batch", "warm_up", "build_cell", "cell_data", "add_counts", "batch_summary", "INTERVAL_METRICS"]

#: metrics with a per-batch value and weight, hence an interval (speedup gets one from the batches' tokens/s)
INTERVAL_METRICS = ("tokens_per_s", "alpha", "E")

Render = Callable[[Sample, int, list[str]], list[int]]


def add_counts(a: list[list[int]] | None, b: list[list[int]] | None) -> list[list[int]] | None:
    """Element-wise sum of two ``[L][E]`` count tables (either may be ``None``)."""
    if a is None or b is None:
        return b if a is None else a
    return [[x + y for x, y in zip(r1, r2)] for r1, r2 in zip(a, b)]


def warm_up(method: Method, samples: Sequence[Sample], render: Render, n: int, settings: DecodeSettings) -> None:
    """``n`` untimed generations of ``samples``' first turns as one batch: kernels, caches and an adaptive
    method's online models (cost, acceptance, AR floor) warm up for that shape. Same for every method."""
    prompts = [render(s, 0, []) for s in samples]
    for w in range(n):
        method.generate(prompts, settings.replace(seed=settings.seed + 10_000 + w))


def run_batch(method: Method, batch: Sequence[Sample], render: Render, decode: Callable[[list[int]], str],
              settings: DecodeSettings) -> dict[str, Any]:
    """Generate ``batch`` (every turn of every sample) with ``method``; turn ``t`` samples with seed
    ``settings.seed + t`` (as for every method), ``render`` is ``(sample, turn, previous_answers) -> token ids``.

    Returns ``{"seconds", "new_tokens", "samples": [{"id", "turns", "tokens"}], "steps", "expert_counts"}``,
    plus ``"calibration"`` for an adaptive selector.
    """
    answers: list[list[str]] = [[] for _ in batch]
    tokens: list[list[list[int]]] = [[] for _ in batch]
    seconds, step_dicts, counts = 0.0, [], None
    for turn in range(max(len(s.turns) for s in batch)):
        rows = [i for i, s in enumerate(batch) if turn < len(s.turns)]
        prompts = [render(batch[i], turn, answers[i]) for i in rows]
        gen = method.generate(prompts, settings.replace(seed=settings.seed + turn))
        seconds += gen.wall_time
        step_dicts += [s.to_dict() for s in gen.steps]
        counts = add_counts(counts, gen.expert_counts)
        for i, toks in zip(rows, gen.tokens):
            tokens[i].append(list(toks))
            answers[i].append(decode(toks))
    out = {"seconds": seconds, "new_tokens": sum(len(t) for row in tokens for t in row),
           "samples": [{"id": s.id, "turns": answers[i], "tokens": tokens[i]} for i, s in enumerate(batch)],
           "steps": step_dicts, "expert_counts": counts}
    calibration = getattr(method, "calibration", None)
    cal = calibration() if calibration is not None else None
    if cal:
        out["calibration"] = cal
    return out


def cell_data(batches: Sequence[dict[str, Any]], temperature: float, bytes_per_expert: int,
              num_moe_layers: int, bytes_per_expert_loaded: int = 0) -> CellData:
    """The metrics input of a cell from its batch records (in sample order)."""
    return CellData(steps=[s for b in batches for s in b["steps"]],
                    batches=[BatchTiming(b["new_tokens"], b["seconds"]) for b in batches],
                    outputs=[[t for turn in smp["tokens"] for t in turn] for b in batches for smp in b["samples"]],
                    temperature=temperature, bytes_per_expert=bytes_per_expert,
                    bytes_per_expert_loaded=bytes_per_expert_loaded, num_moe_layers=num_moe_layers)


def _weight(metric: Metric, data: CellData) -> float:
    """A batch's weight in ``metric``'s cell value: 1 (``batches``), its steps with a value (``steps``) or its
    (step, active row) pairs (``rows``)."""
    if metric.aggregate == "rows":
        return float(sum(len(s.get("accepted") or ()) for s in data.steps))
    if metric.aggregate == "steps":
        one = CellData(temperature=data.temperature, bytes_per_expert=data.bytes_per_expert,
                       bytes_per_expert_loaded=data.bytes_per_expert_loaded, num_moe_layers=data.num_moe_layers)
        n = 0
        for s in data.steps:
            one.steps = [s]
            n += metric.compute(one) is not None
        return float(n)
    return 1.0


def batch_summary(record: dict[str, Any], temperature: float, bytes_per_expert: int, num_moe_layers: int,
                  bytes_per_expert_loaded: int = 0, autoregressive: bool = False) -> dict[str, Any]:
    """One batch of a cell, small: tokens, seconds (and rounds), and per :data:`INTERVAL_METRICS` metric its
    ``[value, weight]`` on this batch; the cell's value is Σ weight·value / Σ weight over the batches."""
    from specmoe.metrics import get

    data = cell_data([record], temperature, bytes_per_expert, num_moe_layers, bytes_per_expert_loaded)
    values: dict[str, list[float]] = {}
    for name in INTERVAL_METRICS:
        m = get(name)
        if autoregressive and not m.applies_to_ar:
            continue
        v = m.compute(data)
        if v is not None:
            values[name] = [float(v), _weight(m, data)]
    out = {"new_tokens": record["new_tokens"], "seconds": record["seconds"], "values": values}
    if record.get("round_seconds"):
        out["round_seconds"] = list(record["round_seconds"])
    return out


def build_cell(batches: Sequence[dict[str, Any]], *, method: str, dataset: str, temperature: float, budget: int,
               batch_size: int, autoregressive: bool, analysis_only: bool, bytes_per_expert: int,
               num_moe_layers: int, bytes_per_expert_loaded: int = 0,
               adaptive: bool = False) -> tuple[CellResult, CellData]:
    """The cell (metrics computed from the batches alone) and its metrics input (for :func:`derive`)."""
    data = cell_data(batches, temperature, bytes_per_expert, num_moe_layers, bytes_per_expert_loaded)
    per_sample, outputs, counts = [], [], None
    for b in batches:
        tps = b["new_tokens"] / b["seconds"] if b["seconds"] > 0 else 0.0
        for smp in b["samples"]:
            per_sample.append({"id": smp["id"], "new_tokens": sum(len(t) for t in smp["tokens"]),
                               "seconds": b["seconds"], "batch_tokens_per_s": tps})
            outputs.append({"id": smp["id"], "turns": smp["turns"], "tokens": smp["tokens"]})
        counts = add_counts(counts, b.get("expert_counts"))
    metrics = summarize(data, autoregressive=autoregressive)
    rounds = [b["round_seconds"] for b in batches if len(b.get("round_seconds", ())) > 1]
    if rounds:  # eval.repeats > 1: how far a batch's slowest round was from its fastest (median over batches)
        metrics["round_spread"] = statistics.median(max(r) / min(r) - 1.0 for r in rounds)
    cell = CellResult(method, dataset, temperature, budget, batch_size, metrics=metrics, autoregressive=autoregressive,
                      analysis_only=analysis_only, per_sample=per_sample, outputs=outputs, steps=data.steps,
                      expert_counts=None if autoregressive else counts, adaptive=adaptive,
                      calibration=next((b["calibration"] for b in reversed(batches) if b.get("calibration")),
                                       None),
                      batches=[batch_summary(b, temperature, bytes_per_expert, num_moe_layers,
                                             bytes_per_expert_loaded, autoregressive) for b in batches],
                      prompt_batches=len(batches))
    return cell, data
