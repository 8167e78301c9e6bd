# SPDX-License-Identifier: Apache-2.0
"""The paper's Table 1 (Spd / α / E per method x dataset) and Table 3 (latency breakdown), from cells.

Cells come from the current run or from the finished cell runs of an MLflow experiment (``platform compare``).
One table per (temperature, γ, batch size); AR cells appear in every γ's table of their temperature and batch size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from specmoe.errors import UserError
from specmoe.evaluation.results import CellResult
from specmoe.evaluation.stats import (
    LEVEL,
    Interval,
    batches_for_margin,
    cross_fit_best,
    cross_fit_ratio,
    pair_interval,
)
from specmoe.metrics import get as get_metric
from specmoe.metrics import mean
from specmoe.metrics import names as metric_names
from specmoe.tracking.runs import json_artifacts, resolve_uri, search_cell_runs
from specmoe.tracking.schema import BATCHES_ARTIFACT, PROMPT_BATCHES, records_csv

if TYPE_CHECKING:
    from mlflow.entities import Run

__all__ = ["Block", "Table", "DEFAULT_METRICS", "TABLE3_METRICS", "resolve_uri", "load_cells",
           "group_blocks", "table1", "table3", "build_tables", "adaptive_tables", "render", "compare",
           "speedup_by_gamma", "speedup_intervals_by_gamma", "attach_batches", "verdicts", "parse_verdict",
           "DEFAULT_MARGIN"]

logger = logging.getLogger(__name__)

DEFAULT_METRICS = ("speedup", "alpha", "E")
TABLE3_METRICS = ("E", "t_pred", "t_draft", "t_verify", "t_total", "alpha", "speedup")
_AR_NAMES = {"ar", "autoregressive", "baseline_ar"}
FORMATS = ("text", "markdown", "csv")
#: the margin ``platform compare --verdict`` sizes its prompt estimate for (relative: 0.02 = 2 %)
DEFAULT_MARGIN = 0.02


@dataclass
class Block:
    """The cells sharing (temperature, budget, batch size): one Table 1 block."""

    temperature: float
    budget: int
    batch_size: int
    methods: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)
    cells: dict[tuple[str, str], CellResult] = field(default_factory=dict)
    ar_methods: set[str] = field(default_factory=set)
    analysis_only: set[str] = field(default_factory=set)
    ar_only: bool = False

    @property
    def title(self) -> str:
        mode = "greedy" if self.temperature == 0 else "sampling"
        gamma = "" if self.ar_only else f", γ={self.budget}"
        return f"T={self.temperature:g} ({mode}){gamma}, batch size {self.batch_size}"


@dataclass
class Table:
    """A rendered table: string cells for text/markdown, numeric records for CSV."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    records: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)


def _truthy(value: str | None) -> bool:
    return str(value).lower() in {"1", "true", "yes"}


def _to_cell(run: Run) -> CellResult | None:
    t = run.data.tags
    try:
        method = t["specmoe.method"]
        ar = _truthy(t.get("specmoe.ar")) if "specmoe.ar" in t else method.lower() in _AR_NAMES
        metrics, intervals = _split_intervals(dict(run.data.metrics))
        return CellResult(method, t["specmoe.dataset"], float(t["specmoe.temperature"]), int(t["specmoe.budget"]),
                          int(t["specmoe.batch_size"]), metrics, autoregressive=ar,
                          analysis_only=_truthy(t.get("specmoe.analysis_only")),
                          adaptive=_truthy(t.get("specmoe.adaptive")), run_id=run.info.run_id,
                          parent=t.get("specmoe.parent") or t.get("mlflow.parentRunId", ""),
                          order=int(run.info.start_time or 0), key=run.data.params.get("group_key", ""),
                          intervals=intervals, prompt_batches=int(metrics.pop(PROMPT_BATCHES, 0)))
    except (KeyError, ValueError) as exc:
        logger.debug("skipping run %s (bad cell tags: %s)", run.info.run_id, exc)
        return None


def _split_intervals(metrics: dict[str, float]) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Cell metrics without their ``<metric>_lo`` / ``<metric>_hi`` bounds, and those bounds."""
    intervals = {}
    for k in [k for k in metrics if k.endswith("_lo") and k[:-3] in metrics and k[:-3] + "_hi" in metrics]:
        intervals[k[:-3]] = [metrics.pop(k), metrics.pop(k[:-3] + "_hi")]
    return metrics, intervals


def attach_batches(uri: str, cells: Iterable[CellResult]) -> None:
    """Read each cell run's per-batch values (artifact ``batches.json``, where present) into ``cell.batches``."""
    with json_artifacts(uri) as read:
        for c in cells:
            if c.batches or not c.run_id:
                continue
            try:
                data = read(c.run_id, BATCHES_ARTIFACT)
                if data is not None:
                    c.batches = data["batches"]
            except Exception as exc:  # noqa: BLE001 - an unreadable artifact only costs the paired numbers
                logger.warning("cell %s: cannot read its %s (%s); no paired comparison for it", c.label,
                               BATCHES_ARTIFACT, exc)


def load_cells(uri: str, experiment: str, run_id: str | None = None, all_runs: bool = False) -> list[CellResult]:
    """The finished cells of ``experiment``: of parent ``run_id``, of every parent (``all_runs``), or of the
    latest parent (default)."""
    cells = [c for c in map(_to_cell, search_cell_runs(uri, experiment, run_id)) if c is not None]
    if not cells:
        which = f"parent run {run_id}" if run_id else f"experiment {experiment!r}"
        raise UserError(f"no finished cell runs (tag specmoe.kind=cell) in {which} at {uri}")
    if not run_id and not all_runs:
        latest = max(cells, key=lambda c: c.order).parent
        cells = [c for c in cells if c.parent == latest]
    return cells


def group_blocks(cells: Iterable[CellResult]) -> list[Block]:
    """One block per (temperature, γ, batch size) of the speculative methods with the AR cells of its setting
    and datasets (AR-only setting: one block); first-run order, AR first; a repeated cell keeps its latest run."""
    cells = sorted(cells, key=lambda c: c.order)
    blocks: dict[tuple[float, int, int], Block] = {}
    own: dict[tuple[float, int, int], set[str]] = {}  # datasets of each block's own (non-AR) cells
    for c in cells:
        if not c.autoregressive:
            key = (c.temperature, c.budget, c.batch_size)
            blocks.setdefault(key, Block(*key))
            own.setdefault(key, set()).add(c.dataset)
    with_methods = {(t, bs) for t, _, bs in blocks}
    for c in cells:
        if c.autoregressive and c.setting not in with_methods:
            key = (c.temperature, c.budget, c.batch_size)
            blocks.setdefault(key, Block(*key, ar_only=True))
    for c in cells:
        for key, b in blocks.items():
            t, g, bs = key
            if (t, bs) != c.setting:
                continue
            if c.autoregressive and not b.ar_only and c.dataset not in own[key]:
                continue  # an AR-only dataset does not add a column to a method table
            if not c.autoregressive and g != c.budget:
                continue
            if c.method not in b.methods:
                b.methods.append(c.method)
            if c.dataset not in b.datasets:
                b.datasets.append(c.dataset)
            b.cells[(c.method, c.dataset)] = c
            if c.autoregressive:
                b.ar_methods.add(c.method)
            if c.analysis_only:
                b.analysis_only.add(c.method)
    for b in blocks.values():
        b.methods.sort(key=lambda m: m not in b.ar_methods)  # stable: AR first, then run order
    return [blocks[k] for k in sorted(blocks)]


def _names() -> tuple[str, ...]:
    return metric_names()


def _value(block: Block, method: str, metric: str, datasets: Sequence[str]) -> float | None:
    """Mean of ``metric`` of ``method`` over ``datasets`` (``None`` when no cell has it)."""
    m = get_metric(metric)
    if method in block.ar_methods and m.ar_value is not None:
        return m.ar_value
    vals = [block.cells[(method, d)].metrics[metric] for d in datasets
            if (method, d) in block.cells and metric in block.cells[(method, d)].metrics]
    return mean(vals)


def _show(block: Block, method: str, metric: str, value: float | None, unit: str = "s") -> str:
    m = get_metric(metric)
    if method in block.ar_methods and not m.applies_to_ar:
        return "-"
    if metric in ("t_pred", "t_draft", "t_select") and value == 0:
        return "-"  # no predictor / drafter in this method
    return m.format(value, unit)


def _time_unit(block: Block) -> str:
    """One unit per table: milliseconds unless some step takes a second or more."""
    times = [v for c in block.cells.values() for k, v in c.metrics.items()
             if k in _names() and get_metric(k).unit == "s"]
    return "s" if times and max(times) >= 1.0 else "ms"


def _method_label(block: Block, method: str) -> str:
    return method + ("*" if method in block.analysis_only else "")


def _notes(block: Block, ar_note: str | None) -> list[str]:
    notes = []
    if block.analysis_only:
        notes.append("* analysis only (e.g. oracle expert sets): not a real end-to-end speedup")
    if block.ar_methods and ar_note:
        notes.append(ar_note)
    return notes


def _bound(metric: str, value: float, unit: str) -> str:
    """An interval bound as the metric's values print, without the ratio sign (``0.99``)."""
    text = get_metric(metric).format(value, unit)
    return text[:-1] if text.endswith("x") else text


def _with_interval(text: str, cell: CellResult | None, metric: str, unit: str) -> str:
    """``text`` followed by the cell's interval on ``metric`` (``1.03x [0.99, 1.07]``) when it has one."""
    bounds = cell.intervals.get(metric) if cell is not None else None
    if not bounds or text in ("-", "n/a"):
        return text
    return f"{text} [{_bound(metric, bounds[0], unit)}, {_bound(metric, bounds[1], unit)}]"


def _level_note(shown: bool) -> str:
    return f" — {LEVEL:.0%} intervals [lo, hi]" if shown else ""


def table1(block: Block, metrics: Sequence[str] = DEFAULT_METRICS) -> Table:
    """Rows = methods, columns = datasets + Average, cells = the ``metrics`` joined by " / " (with the
    cell's confidence interval where it has one; the Average column has none)."""
    columns = ["Method", *block.datasets, "Average"]
    rows, records = [], []
    base = {"table": "table1", "temperature": block.temperature, "budget": block.budget,
            "batch_size": block.batch_size}
    unit = _time_unit(block)
    shown = False
    for m in block.methods:
        row = [_method_label(block, m)]
        for ds in [*block.datasets, None]:
            if ds is not None and (m, ds) not in block.cells:
                row.append("n/a")
                continue
            over = block.datasets if ds is None else [ds]
            cell = None if ds is None else block.cells[(m, ds)]
            vals = {k: _value(block, m, k, over) for k in metrics}
            parts = [_show(block, m, k, v, unit) for k, v in vals.items()]
            with_iv = [_with_interval(p, cell, k, unit) for p, k in zip(parts, vals)]
            shown = shown or with_iv != parts
            row.append(" / ".join(with_iv))
            bounds = {f"{k}_{side}": b for k in metrics if cell is not None and k in cell.intervals
                      for side, b in zip(("lo", "hi"), cell.intervals[k])}
            records.append({**base, "method": m, "dataset": ds or "Average", **vals, **bounds})
        rows.append(row)
    title = (f"Table 1 — {block.title} — cells: {' / '.join(get_metric(k).label for k in metrics)}"
             f"{_level_note(shown)}")
    notes = _notes(block, None)
    if shown:
        notes.append(f"[lo, hi]: {LEVEL:.0%} confidence interval, paired bootstrap over the prompt batches of the "
                     "cell's group (Average: means of the datasets' values, no interval)")
    return Table(title, columns, rows, records, notes)


def table3(block: Block) -> Table:
    """Latency breakdown per method, averaged over the block's datasets (seconds per step)."""
    columns = ["Method", *(get_metric(k).label for k in TABLE3_METRICS)]
    rows, records = [], []
    unit = _time_unit(block)
    for m in block.methods:
        vals = {k: _value(block, m, k, block.datasets) for k in TABLE3_METRICS}
        cells = [_show(block, m, k, v, unit) for k, v in vals.items()]
        if m in block.ar_methods:  # fixed by definition for AR (α = 1) rather than "not applicable"
            for i, k in enumerate(TABLE3_METRICS):
                if get_metric(k).ar_value is not None:
                    cells[i] = get_metric(k).format(get_metric(k).ar_value, unit)
            cells[TABLE3_METRICS.index("t_total")] += "†"
        rows.append([_method_label(block, m), *cells])
        records.append({"table": "table3", "temperature": block.temperature, "budget": block.budget,
                        "batch_size": block.batch_size, "method": m, "dataset": "Average", **vals})
    title = f"Table 3 — latency breakdown per step, mean over {len(block.datasets)} datasets — {block.title}"
    return Table(title, columns, rows, records,
                 _notes(block, "† AR: T_total is the per-token latency (one token per step)"))


def _best_fixed(cells: Sequence[CellResult], datasets: Sequence[str]) -> tuple[str, float] | None:
    """The fixed-γ cell label (``method@γ``) with the highest mean speedup over ``datasets`` (each present)."""
    by: dict[str, dict[str, float]] = {}
    for c in cells:
        if not (c.autoregressive or c.adaptive or c.analysis_only) and "speedup" in c.metrics:
            by.setdefault(f"{c.method}@{c.budget}", {})[c.dataset] = c.metrics["speedup"]
    scored = [(lab, sum(v[d] for d in datasets) / len(datasets)) for lab, v in by.items()
              if all(d in v for d in datasets)]
    return max(scored, key=lambda x: x[1]) if scored else None


def _tps(cell: CellResult) -> list[float] | None:
    """Tokens/s of each prompt batch of ``cell`` (``None`` when its batches are not recorded)."""
    vals = [b.get("values", {}).get("tokens_per_s") for b in cell.batches]
    return [v[0] for v in vals] if vals and all(v is not None for v in vals) else None


def _cross_fit_data(here: Sequence[CellResult], datasets: Sequence[str]) -> tuple[list, list] | None:
    """Per dataset, ``[M, n]`` tokens/s of the fixed-γ members and AR's ``[n]`` (:func:`cross_fit_best`) or None."""
    fixed: dict[str, dict[str, list[float]]] = {}
    ar: dict[str, list[float]] = {}
    for c in here:
        tps = _tps(c) if c.dataset in datasets else None
        if tps is None or c.analysis_only or c.adaptive:
            continue
        if c.autoregressive:
            ar[c.dataset] = tps
        else:
            fixed.setdefault(f"{c.method}@{c.budget}", {})[c.dataset] = tps
    labels = [lab for lab, v in fixed.items()
              if all(d in v and d in ar and len(v[d]) == len(ar[d]) for d in datasets)]
    if not labels:
        return None
    return [[fixed[lab][d] for lab in labels] for d in datasets], [ar[d] for d in datasets]


def _cross_fit(here: Sequence[CellResult], datasets: Sequence[str]) -> float | None:
    """Cross-fitted best fixed-γ speedup over ``datasets`` (one member for all; :func:`cross_fit_best`) or None."""
    data = _cross_fit_data(here, datasets)
    out = cross_fit_best(*data) if data else None
    return out["cross_fitted"] if out else None


def _cross_fit_interval(here: Sequence[CellResult], name: str, datasets: Sequence[str]) -> Interval | None:
    """The adaptive member ``name`` over the cross-fitted best fixed γ, with interval (:func:`cross_fit_ratio`)."""
    data = _cross_fit_data(here, datasets)
    mine = [_cell_of(here, name, d) for d in datasets]
    tps = [_tps(c) if c is not None else None for c in mine]
    if data is None or any(t is None or len(t) != len(a) for t, a in zip(tps, data[1])):
        return None
    return cross_fit_ratio(tps, *data)


def _cell_of(here: Sequence[CellResult], label: str, dataset: str) -> CellResult | None:
    return next((c for c in here if f"{c.method}@{c.budget}" == label and c.dataset == dataset), None)


def _adaptive_entry(here: Sequence[CellResult], name: str, over: Sequence[str], b: tuple[str, float] | None,
                    cf: float | None, base: dict[str, Any], fitted: bool) -> tuple[str, dict[str, Any], bool]:
    """One :func:`adaptive_tables` entry: ``name`` over ``over`` against the best fixed member ``b``
    (``(label, speedup)`` or None) and the cross-fitted best ``cf``; returns (text, record, shows an interval)."""
    vals = [c.metrics["speedup"] for c in here if c.adaptive and f"{c.method}@{c.budget}" == name
            and c.dataset in over and "speedup" in c.metrics]
    spd = sum(vals) / len(vals) if len(vals) == len(over) else None
    ratio = spd / b[1] if spd is not None and b and b[1] > 0 else None
    crat = spd / cf if spd is not None and cf else None
    rec = {**base, "method": name, "speedup": spd, "best_fixed": b[0] if b else None,
           "best_fixed_speedup": b[1] if b else None, "ratio_to_best_fixed": ratio}
    if spd is None:
        return "n/a", rec, False
    shown = False
    text = f"{spd:.2f}x"
    mine = _cell_of(here, name, over[0]) if len(over) == 1 else None
    pair = pair_interval(mine, _cell_of(here, b[0], over[0])) if mine is not None and b else None
    if mine is not None and "speedup" in mine.intervals:
        text = _with_interval(text, mine, "speedup", "s")
        rec.update(speedup_lo=mine.intervals["speedup"][0], speedup_hi=mine.intervals["speedup"][1])
        shown = True
    extra = []
    if ratio:
        best_ratio = pair.format() if pair is not None and pair.resolved else f"{ratio:.2f}x"
        extra.append(f"{best_ratio} best")
        if pair is not None and pair.resolved:
            rec.update(ratio_to_best_fixed_lo=pair.lo, ratio_to_best_fixed_hi=pair.hi,
                       verdict_vs_best_fixed=pair.verdict())
            shown = True
    if fitted:
        civ = _cross_fit_interval(here, name, over) if crat is not None else None
        extra.append("n/a cross-fitted" if crat is None else
                     f"{civ.format() if civ is not None and civ.resolved else f'{crat:.2f}x'} cross-fitted")
        rec.update(best_fixed_cross_fitted=cf, ratio_to_cross_fitted=crat)
        if civ is not None and civ.resolved:
            rec.update(ratio_to_cross_fitted_lo=civ.lo, ratio_to_cross_fitted_hi=civ.hi,
                       verdict_vs_cross_fitted=civ.verdict())
            shown = True
    return text + (f" ({', '.join(extra)})" if extra else ""), rec, shown


def adaptive_tables(cells: Iterable[CellResult]) -> list[Table]:
    """Per (temperature, batch size) with adaptive cells: each adaptive method's speedup over AR and its ratio
    to the best fixed-γ (method, γ), per dataset and on average (Average: one (method, γ) for all datasets).
    With per-batch values that in-sample best (biased upwards) is joined by the cross-fitted best, and the
    adaptive speedup and its paired ratio to the in-sample best get intervals."""
    cells = sorted(cells, key=lambda c: c.order)
    out = []
    for t, bs in dict.fromkeys(c.setting for c in cells if c.adaptive):
        here = [c for c in cells if c.setting == (t, bs)]
        datasets = list(dict.fromkeys(c.dataset for c in here if c.adaptive))
        cols: list[Sequence[str]] = [[d] for d in datasets] + [datasets]
        best = [_best_fixed([c for c in here if c.dataset in over], over) for over in cols]
        crossed = [_cross_fit(here, over) for over in cols]
        fitted = any(v is not None for v in crossed)
        first = "best fixed γ (in-sample max)" if fitted else "best fixed γ"
        rows = [[first, *(f"{v:.2f}x {lab}" if b else "n/a" for b in best for lab, v in [b or ("", 0)])]]
        if fitted:
            rows.append(["best fixed γ (cross-fitted)", *("n/a" if v is None else f"{v:.2f}x" for v in crossed)])
        records = []
        base = {"table": "adaptive", "temperature": t, "batch_size": bs}
        shown = False
        for name in dict.fromkeys(f"{c.method}@{c.budget}" for c in here if c.adaptive):
            row = [name]
            for over, b, cf, label in zip(cols, best, crossed, [*datasets, "Average"]):
                text, rec, with_iv = _adaptive_entry(here, name, over, b, cf, {**base, "dataset": label}, fitted)
                row.append(text)
                records.append(rec)
                shown = shown or with_iv
            rows.append(row)
        mode = "greedy" if t == 0 else "sampling"
        notes = ["best fixed γ: the fastest non-adaptive method and γ of the cell (Average: one for all "
                 "datasets, i.e. a static best-γ table chosen on these prompts)"]
        if fitted:
            notes = ["best fixed γ (in-sample max): the fastest non-adaptive method and γ measured on the same "
                     "prompts it is compared on (biased upwards: the maximum of noisy measurements); "
                     "cross-fitted: chosen on half of the prompt batches, measured on the other half, averaged "
                     "over 50 random halves (Average: one choice for all datasets); its interval redoes the choice "
                     "in every resample on one random half, so it errs wide"]
        if shown:
            notes.append(f"[lo, hi]: {LEVEL:.0%} confidence interval, paired bootstrap over the group's prompt "
                         "batches")
        out.append(Table(f"Adaptive vs best fixed γ — T={t:g} ({mode}), batch size {bs} — speedup over AR"
                         f"{_level_note(shown)}", ["Method", *datasets, "Average"], rows, records, notes))
    return out


def parse_verdict(spec: str) -> tuple[tuple[str, int | None], tuple[str, int | None]]:
    """``METHOD[@γ]:BASELINE[@γ]`` -> ((method, γ), (baseline, γ)); a clear error otherwise."""
    def one(part: str) -> tuple[str, int | None]:
        name, _, gamma = part.partition("@")
        if not name or (gamma and not gamma.isdigit()):
            raise UserError(f"--verdict {spec!r}: expected METHOD[@γ]:BASELINE[@γ], e.g. goodput:ar or "
                            f"ecospec@4:eagle3@4")
        return name, int(gamma) if gamma else None
    if spec.count(":") != 1:
        raise UserError(f"--verdict {spec!r}: expected METHOD[@γ]:BASELINE[@γ], e.g. goodput:ar or "
                        f"ecospec@4:eagle3@4")
    a, b = spec.split(":")
    return one(a), one(b)


def _pairs(cells: Sequence[CellResult], method: tuple[str, int | None],
           baseline: tuple[str, int | None]) -> list[tuple[CellResult, CellResult]]:
    """(method cell, baseline cell) of each (dataset, T, batch size): the baseline at the method's γ when it
    has that γ (or at the γ asked for), else at each of its γ; an AR baseline has one cell."""
    out = []
    for c in cells:
        if c.method != method[0] or (method[1] is not None and c.budget != method[1]):
            continue
        base = [b for b in cells if b.method == baseline[0] and b.dataset == c.dataset and b.setting == c.setting
                and (baseline[1] is None or b.autoregressive or b.budget == baseline[1])]
        same = [b for b in base if b.budget == c.budget or b.autoregressive]
        out += [(c, b) for b in (same if baseline[1] is None and same else base)]
    return out


def verdicts(cells: Iterable[CellResult], method: tuple[str, int | None], baseline: tuple[str, int | None],
             margin: float = DEFAULT_MARGIN) -> Table:
    """One row per cell of ``method``: its tokens/s over ``baseline``'s on the same prompt batches, interval,
    verdict (faster / slower / not resolved) and the prompts an interval of ±``margin`` would need."""
    cells = sorted(cells, key=lambda c: c.order)
    known = {c.method for c in cells}
    for name, _ in (method, baseline):
        if name not in known:
            raise UserError(f"--verdict: no cells of method {name!r}; methods: {', '.join(sorted(known))}")
    label = lambda m: m[0] + (f"@{m[1]}" if m[1] is not None else "")  # noqa: E731
    rows, records = [], []
    for c, b in _pairs(cells, method, baseline):
        iv = c.interval("speedup") if b.autoregressive else pair_interval(c, b)
        n = c.prompt_batches or len(c.batches)
        if iv is None:
            value = c.metrics.get("speedup") if b.autoregressive else None
            if value is None and "speedup" in c.metrics and "speedup" in b.metrics and b.metrics["speedup"]:
                value = c.metrics["speedup"] / b.metrics["speedup"]
            text, judged, need = ("n/a" if value is None else f"{value:.2f}x"), "not resolved", None
        else:
            text, judged = iv.format(), iv.verdict()
            need = batches_for_margin(iv.lo, iv.hi, n, margin)
        why = "" if iv is not None and iv.resolved else (
            f" (no interval: {n} prompt batch{'es' if n != 1 else ''})" if n else " (no per-batch values)")
        prompts = "n/a" if need is None else str(need * c.batch_size)
        gamma = "-" if c.autoregressive else str(c.budget)
        other = b.method + ("" if b.autoregressive else f"@{b.budget}")
        rows.append([c.dataset, f"{c.temperature:g}", gamma, str(c.batch_size), other, text, judged + why,
                     str(n * c.batch_size) if n else "n/a", prompts])
        records.append({"table": "verdict", "dataset": c.dataset, "temperature": c.temperature, "budget": c.budget,
                        "batch_size": c.batch_size, "method": c.method, "baseline": other,
                        "ratio": None if iv is None else iv.value, "lo": None if iv is None else iv.lo,
                        "hi": None if iv is None else iv.hi, "verdict": judged,
                        "prompts": n * c.batch_size if n else None,
                        "prompts_for_margin": None if need is None else need * c.batch_size})
    if not rows:
        raise UserError(f"--verdict: no cell of {label(method)} has a {label(baseline)} cell in the same "
                        f"dataset, temperature and batch size")
    cols = ["dataset", "T", "γ", "batch", "baseline", f"ratio [{LEVEL:.0%} interval]", "verdict", "prompts",
            f"prompts for ±{margin:.0%}"]
    return Table(f"Verdicts — {label(method)} vs {label(baseline)} — tokens/s ratio, {LEVEL:.0%} intervals", cols,
                 rows, records, [f"verdict: faster / slower when the whole interval is above / below 1; prompts "
                                 f"for ±{margin:.0%}: prompts the cell needs for an interval half-width of "
                                 f"{margin:.0%} (from the observed spread, which shrinks as 1/√n)"])


def build_tables(cells: Iterable[CellResult], metrics: Sequence[str] = DEFAULT_METRICS) -> list[Table]:
    """Table 1 for every block, then Table 3 for every block, then the adaptive-vs-best-fixed-γ tables."""
    bad = [m for m in metrics if m not in _names()]
    if bad:
        raise UserError(f"unknown metric(s) {', '.join(bad)} for --metric; "
                        f"choose from {', '.join(_names())}")
    cells = list(cells)
    blocks = group_blocks(cells)
    return [table1(b, metrics) for b in blocks] + [table3(b) for b in blocks] + adaptive_tables(cells)


def speedup_by_gamma(cells: Iterable[CellResult], temperature: float = 0.0, batch_size: int = 1,
                     metric: str = "speedup") -> dict[str, dict[int, float]]:
    """method -> {γ: mean ``metric`` over datasets} at one temperature and batch size (AR left out)."""
    out: dict[str, dict[int, float]] = {}
    for b in group_blocks(cells):
        if b.temperature != temperature or b.batch_size != batch_size:
            continue
        for m in b.methods:
            value = _value(b, m, metric, b.datasets)
            if m not in b.ar_methods and value is not None:
                out.setdefault(m, {})[b.budget] = value
    return out


def speedup_intervals_by_gamma(cells: Iterable[CellResult], temperature: float = 0.0,
                               batch_size: int = 1) -> dict[str, dict[int, tuple[float, float]]]:
    """method -> {γ: (lo, hi)} behind :func:`speedup_by_gamma`'s points (single-dataset blocks only)."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for b in group_blocks(cells):
        if b.temperature != temperature or b.batch_size != batch_size or len(b.datasets) != 1:
            continue
        for m in b.methods:
            cell = b.cells.get((m, b.datasets[0]))
            if m not in b.ar_methods and cell is not None and "speedup" in cell.intervals:
                lo, hi = cell.intervals["speedup"]
                out.setdefault(m, {})[b.budget] = (lo, hi)
    return out


def _render_text(t: Table) -> str:
    grid = [t.columns, *t.rows]
    widths = [max(len(r[i]) for r in grid) for i in range(len(t.columns))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip()
    out = [t.title, line(t.columns), "  ".join("-" * w for w in widths)] + [line(r) for r in t.rows]
    return "\n".join(out + t.notes)


def _render_markdown(t: Table) -> str:
    out = [f"### {t.title}", "", "| " + " | ".join(t.columns) + " |",
           "|" + "|".join(["---"] + ["---:"] * (len(t.columns) - 1)) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in t.rows]
    if t.notes:
        out += [""] + [f"{n}  " for n in t.notes]
    return "\n".join(out)


def _render_csv(tables: Sequence[Table]) -> str:
    return records_csv((r for t in tables for r in t.records), lambda v: "" if v is None else v)


def render(tables: Sequence[Table], fmt: str = "text") -> str:
    """``text`` (aligned columns), ``markdown`` (pipe tables) or ``csv`` (one tidy numeric record per
    cell, with a ``table`` column; empty = not available)."""
    if fmt == "csv":
        return _render_csv(tables)
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    one = _render_text if fmt == "text" else _render_markdown
    return "\n\n".join(one(t) for t in tables) + "\n"


def compare(uri: str, experiment: str, metrics: Sequence[str] = DEFAULT_METRICS, run_id: str | None = None,
            all_runs: bool = False, fmt: str = "text", verdict: Sequence[str] = (),
            margin: float = DEFAULT_MARGIN) -> str:
    """Load the cells and render the tables (and a verdict table per ``METHOD:BASELINE`` of ``verdict``).
    The per-batch values of the cells that need them (adaptive settings, verdicts) are read from MLflow."""
    if not (0 < margin < 1):
        raise UserError(f"--margin {margin}: a relative margin between 0 and 1 (0.02 = 2 %)")
    specs = [parse_verdict(v) for v in verdict]
    cells = load_cells(uri, experiment, run_id, all_runs)
    names = {n for spec in specs for n, _ in spec}
    adaptive = {c.setting for c in cells if c.adaptive}
    attach_batches(uri, [c for c in cells if c.setting in adaptive or c.method in names])
    tables = build_tables(cells, metrics) + [verdicts(cells, a, b, margin) for a, b in specs]
    return render(tables, fmt)
