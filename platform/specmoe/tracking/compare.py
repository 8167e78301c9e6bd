# SPDX-License-Identifier: Apache-2.0
"""The paper's Table 1 (Spd / α / E per method x dataset) and Table 3 (latency breakdown), from cells.

Cells are :class:`~specmoe.evaluation.results.CellResult` s: those of the current run (the evaluation builds
the tables once from them) or the FINISHED nested runs tagged ``specmoe.kind=cell`` of an MLflow experiment
(``platform compare``, through the MLflow client API, from any process against any tracking URI; by default
only the cells of the latest parent run: the parent whose most recent finished cell started last; a cell
logged twice keeps its latest run). Labels, formats and AR applicability come from :mod:`specmoe.metrics`.

One table per setting: a setting is (temperature, γ, batch size) of the speculative methods; the AR cells of
the same temperature and batch size (AR has no γ) appear in every γ's table instead of a table of their own.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from specmoe.errors import UserError
from specmoe.evaluation.results import CellResult
from specmoe.metrics import get as get_metric
from specmoe.metrics import names as metric_names
from specmoe.tracking.schema import CELL_KIND, records_csv

__all__ = ["Block", "Table", "DEFAULT_METRICS", "TABLE3_METRICS", "resolve_uri", "load_cells",
           "group_blocks", "table1", "table3", "build_tables", "adaptive_tables", "render", "compare",
           "speedup_by_gamma"]

logger = logging.getLogger(__name__)

DEFAULT_METRICS = ("speedup", "alpha", "E")
TABLE3_METRICS = ("E", "t_pred", "t_draft", "t_verify", "t_total", "alpha", "speedup")
_AR_NAMES = {"ar", "autoregressive", "baseline_ar"}
FORMATS = ("text", "markdown", "csv")


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


def resolve_uri(uri: str | None, workdir: Path | None = None) -> str:
    """``uri`` > ``$MLFLOW_TRACKING_URI`` > ``sqlite:///<workdir>/mlflow.db`` (which must exist)."""
    from specmoe.tracking.uri import default_uri

    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    workdir = Path(workdir or Path.cwd())
    if not (workdir / "mlflow.db").is_file():
        raise UserError(f"no MLflow store found: {workdir / 'mlflow.db'} does not exist. Run from the "
                        "directory where the recipe ran, or pass --uri (or set MLFLOW_TRACKING_URI)")
    return default_uri(workdir)


def _truthy(value: str | None) -> bool:
    return str(value).lower() in {"1", "true", "yes"}


def _to_cell(run: Any) -> CellResult | None:
    t = run.data.tags
    try:
        method = t["specmoe.method"]
        ar = _truthy(t.get("specmoe.ar")) if "specmoe.ar" in t else method.lower() in _AR_NAMES
        return CellResult(method, t["specmoe.dataset"], float(t["specmoe.temperature"]), int(t["specmoe.budget"]),
                          int(t["specmoe.batch_size"]), dict(run.data.metrics), autoregressive=ar,
                          analysis_only=_truthy(t.get("specmoe.analysis_only")),
                          adaptive=_truthy(t.get("specmoe.adaptive")), run_id=run.info.run_id,
                          parent=t.get("specmoe.parent") or t.get("mlflow.parentRunId", ""),
                          order=int(run.info.start_time or 0))
    except (KeyError, ValueError) as exc:
        logger.debug("skipping run %s (bad cell tags: %s)", run.info.run_id, exc)
        return None


def load_cells(uri: str, experiment: str, run_id: str | None = None, all_runs: bool = False) -> list[CellResult]:
    """The finished cells of ``experiment``: of parent ``run_id``, of every parent (``all_runs``), or of the
    latest parent (default)."""
    from mlflow import MlflowClient

    from specmoe.tracking.uri import check_uri

    check_uri(uri)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise UserError(f"experiment {experiment!r} not found at {uri}; experiments there: "
                        f"{', '.join(names) or '(none)'}")
    flt = f"tags.`specmoe.kind` = '{CELL_KIND}' and attributes.status = 'FINISHED'"
    if run_id and not re.fullmatch(r"[\w-]+", run_id):
        raise UserError(f"--run-id {run_id!r} is not an MLflow run id (letters, digits, '_', '-')")
    if run_id:
        flt += f" and tags.`specmoe.parent` = '{run_id}'"
    cells, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], filter_string=flt, max_results=1000, page_token=token,
                                  order_by=["attributes.start_time ASC"])
        cells += [c for c in map(_to_cell, page) if c is not None]
        token = page.token
        if not token:
            break
    if not cells:
        which = f"parent run {run_id}" if run_id else f"experiment {experiment!r}"
        raise UserError(f"no finished cell runs (tag specmoe.kind=cell) in {which} at {uri}")
    if not run_id and not all_runs:
        latest = max(cells, key=lambda c: c.order).parent
        cells = [c for c in cells if c.parent == latest]
    return cells


def group_blocks(cells: Iterable[CellResult]) -> list[Block]:
    """One block per setting (temperature, γ, batch size) of the speculative methods, each with the AR cells
    of its temperature and batch size on its datasets; a (temperature, batch size) holding only AR cells gets
    one block. Methods and datasets keep the order in which they first ran (AR methods first); a repeated
    cell keeps its latest run."""
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


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _value(block: Block, method: str, metric: str, datasets: Sequence[str]) -> float | None:
    """Mean of ``metric`` of ``method`` over ``datasets`` (``None`` when no cell has it)."""
    m = get_metric(metric)
    if method in block.ar_methods and m.ar_value is not None:
        return m.ar_value
    vals = [block.cells[(method, d)].metrics[metric] for d in datasets
            if (method, d) in block.cells and metric in block.cells[(method, d)].metrics]
    return _mean(vals)


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


def table1(block: Block, metrics: Sequence[str] = DEFAULT_METRICS) -> Table:
    """Rows = methods, columns = datasets + Average, cells = the ``metrics`` joined by " / "."""
    columns = ["Method", *block.datasets, "Average"]
    rows, records = [], []
    base = {"table": "table1", "temperature": block.temperature, "budget": block.budget,
            "batch_size": block.batch_size}
    unit = _time_unit(block)
    for m in block.methods:
        row = [_method_label(block, m)]
        for ds in [*block.datasets, None]:
            if ds is not None and (m, ds) not in block.cells:
                row.append("n/a")
                continue
            over = block.datasets if ds is None else [ds]
            vals = {k: _value(block, m, k, over) for k in metrics}
            row.append(" / ".join(_show(block, m, k, v, unit) for k, v in vals.items()))
            records.append({**base, "method": m, "dataset": ds or "Average", **vals})
        rows.append(row)
    title = f"Table 1 — {block.title} — cells: {' / '.join(get_metric(k).label for k in metrics)}"
    return Table(title, columns, rows, records, _notes(block, None))


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


def adaptive_tables(cells: Iterable[CellResult]) -> list[Table]:
    """Per (temperature, batch size) with adaptive cells: the best fixed-γ method (over every method and γ)
    next to each adaptive method, per dataset and on average (speedup over AR; the adaptive rows also show
    their ratio to that best). The Average column's best is one (method, γ) for all datasets: the static
    best-γ-per-batch-size choice."""
    cells = sorted(cells, key=lambda c: c.order)
    out = []
    for t, bs in dict.fromkeys(c.setting for c in cells if c.adaptive):
        here = [c for c in cells if c.setting == (t, bs)]
        datasets = list(dict.fromkeys(c.dataset for c in here if c.adaptive))
        cols: list[Sequence[str]] = [[d] for d in datasets] + [datasets]
        best = [_best_fixed([c for c in here if c.dataset in over], over) for over in cols]
        rows = [["best fixed γ", *(f"{v:.2f}x {lab}" if b else "n/a" for b in best for lab, v in [b or ("", 0)])]]
        records = []
        base = {"table": "adaptive", "temperature": t, "batch_size": bs}
        for name in dict.fromkeys(f"{c.method}@{c.budget}" for c in here if c.adaptive):
            row = [name]
            for over, b, label in zip(cols, best, [*datasets, "Average"]):
                vals = [c.metrics["speedup"] for c in here if c.adaptive and f"{c.method}@{c.budget}" == name
                        and c.dataset in over and "speedup" in c.metrics]
                spd = sum(vals) / len(vals) if len(vals) == len(over) else None
                ratio = spd / b[1] if spd is not None and b and b[1] > 0 else None
                row.append("n/a" if spd is None else f"{spd:.2f}x" + (f" ({ratio:.2f}x best)" if ratio else ""))
                records.append({**base, "method": name, "dataset": label, "speedup": spd,
                                "best_fixed": b[0] if b else None, "best_fixed_speedup": b[1] if b else None,
                                "ratio_to_best_fixed": ratio})
            rows.append(row)
        mode = "greedy" if t == 0 else "sampling"
        out.append(Table(f"Adaptive vs best fixed γ — T={t:g} ({mode}), batch size {bs} — speedup over AR",
                         ["Method", *datasets, "Average"], rows, records,
                         ["best fixed γ: the fastest non-adaptive method and γ of the cell (Average: one for all "
                          "datasets, i.e. a static best-γ table chosen on these prompts)"]))
    return out


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
    """method -> {gamma: mean ``metric`` over datasets} at one temperature and batch size (input of
    :func:`specmoe.tracking.plots.fig_speedup_vs_gamma`); AR methods are left out."""
    out: dict[str, dict[int, float]] = {}
    for b in group_blocks(cells):
        if b.temperature != temperature or b.batch_size != batch_size:
            continue
        for m in b.methods:
            value = _value(b, m, metric, b.datasets)
            if m not in b.ar_methods and value is not None:
                out.setdefault(m, {})[b.budget] = value
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
            all_runs: bool = False, fmt: str = "text") -> str:
    """Load the cells and render both tables."""
    return render(build_tables(load_cells(uri, experiment, run_id, all_runs), metrics), fmt)
