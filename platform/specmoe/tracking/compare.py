# SPDX-License-Identifier: Apache-2.0
"""The paper's Table 1 (Spd / α / E per method x dataset) and Table 3 (latency breakdown) from MLflow runs.

Cells are the FINISHED nested runs tagged ``specmoe.kind=cell`` (see :data:`~specmoe.tracking.CELL_TAGS`),
read through the MLflow client API, so this works from any process against any tracking URI. By default
only the cells of the latest parent (recipe) run are used: the parent whose most recent finished cell
started last. A cell key logged twice keeps its latest run.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from specmoe.errors import UserError
from specmoe.tracking.tracker import CELL_KIND, CELL_METRICS

__all__ = ["Cell", "Block", "Table", "DEFAULT_METRICS", "TABLE3_METRICS", "resolve_uri", "load_cells",
           "group_blocks", "table1", "table3", "build_tables", "render", "compare", "log_comparison",
           "speedup_by_gamma"]

logger = logging.getLogger(__name__)

DEFAULT_METRICS = ("speedup", "alpha", "E")
TABLE3_METRICS = ("E", "t_pred", "t_draft", "t_verify", "t_total", "alpha", "speedup")
_LABELS = {"speedup": "Spd", "alpha": "α", "E": "E", "E_pred": "E_pred",
           "expert_bytes_per_step": "bytes/step", "expert_bytes_per_step_loaded": "bytes/step (loaded)",
           "t_pred": "T_pred", "t_draft": "T_draft", "t_select": "T_select", "t_verify": "T_verify",
           "t_total": "T_total", "rho": "ρ", "tokens_per_s": "tok/s", "predictor_accuracy": "pred acc",
           "matches_ar": "= AR"}
#: metrics that do not apply to the AR baseline (shown as "-").
_NOT_AR = {"alpha", "E_pred", "t_pred", "t_draft", "t_select", "t_verify", "rho", "predictor_accuracy", "matches_ar"}
_AR_NAMES = {"ar", "autoregressive", "baseline_ar"}
FORMATS = ("text", "markdown", "csv")


@dataclass
class Cell:
    """One finished evaluation cell run."""

    run_id: str
    parent: str
    method: str
    dataset: str
    temperature: float
    budget: int
    batch_size: int
    start_time: int
    metrics: dict[str, float]
    ar: bool = False
    analysis_only: bool = False


@dataclass
class Block:
    """The cells sharing (temperature, budget, batch size): one Table 1 block."""

    temperature: float
    budget: int
    batch_size: int
    methods: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    ar_methods: set[str] = field(default_factory=set)
    analysis_only: set[str] = field(default_factory=set)

    @property
    def title(self) -> str:
        mode = "greedy" if self.temperature == 0 else "sampling"
        return f"T={self.temperature:g} ({mode}), γ={self.budget}, batch size {self.batch_size}"


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
    from specmoe.tracking.tracker import default_uri

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


def _to_cell(run: Any) -> Cell | None:
    t = run.data.tags
    try:
        method = t["specmoe.method"]
        cell = Cell(run.info.run_id, t.get("specmoe.parent") or t.get("mlflow.parentRunId", ""), method,
                    t["specmoe.dataset"], float(t["specmoe.temperature"]), int(t["specmoe.budget"]),
                    int(t["specmoe.batch_size"]), int(run.info.start_time or 0), dict(run.data.metrics))
    except (KeyError, ValueError) as exc:
        logger.debug("skipping run %s (bad cell tags: %s)", run.info.run_id, exc)
        return None
    cell.ar = _truthy(t.get("specmoe.ar")) if "specmoe.ar" in t else method.lower() in _AR_NAMES
    cell.analysis_only = _truthy(t.get("specmoe.analysis_only"))
    return cell


def load_cells(uri: str, experiment: str, run_id: str | None = None, all_runs: bool = False) -> list[Cell]:
    """The finished cells of ``experiment``: of parent ``run_id``, of every parent (``all_runs``), or of the
    latest parent (default)."""
    from mlflow import MlflowClient

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
        latest = max(cells, key=lambda c: c.start_time).parent
        cells = [c for c in cells if c.parent == latest]
    return cells


def group_blocks(cells: Iterable[Cell]) -> list[Block]:
    """Group cells into blocks by (temperature, budget, batch size); methods and datasets keep the order
    in which they first ran (AR methods first); a repeated cell keeps its latest run."""
    blocks: dict[tuple[float, int, int], Block] = {}
    for c in sorted(cells, key=lambda c: c.start_time):
        b = blocks.setdefault((c.temperature, c.budget, c.batch_size),
                              Block(c.temperature, c.budget, c.batch_size))
        if c.method not in b.methods:
            b.methods.append(c.method)
        if c.dataset not in b.datasets:
            b.datasets.append(c.dataset)
        b.cells[(c.method, c.dataset)] = c
        if c.ar:
            b.ar_methods.add(c.method)
        if c.analysis_only:
            b.analysis_only.add(c.method)
    _share_ar(list(blocks.values()))
    for b in blocks.values():
        b.methods.sort(key=lambda m: m not in b.ar_methods)  # stable: AR first, then run order
    return [blocks[k] for k in sorted(blocks)]


def _share_ar(blocks: list[Block]) -> None:
    """AR does not depend on γ: a block without an AR method borrows the latest AR cells of the same
    temperature and batch size (for its own datasets)."""
    ar: dict[tuple[float, int, str, str], Cell] = {}
    for b in blocks:
        for (m, ds), c in b.cells.items():
            key = (b.temperature, b.batch_size, m, ds)
            if c.ar and (key not in ar or c.start_time > ar[key].start_time):
                ar[key] = c
    for b in blocks:
        for (temp, bs, m, ds), c in ar.items():
            if (temp, bs) != (b.temperature, b.batch_size) or ds not in b.datasets:
                continue
            if m not in b.methods:
                b.methods.append(m)
                b.ar_methods.add(m)
            if m in b.ar_methods and (m, ds) not in b.cells:
                b.cells[(m, ds)] = c


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fmt(metric: str, value: float | None, unit: str = "s") -> str:
    if value is None:
        return "n/a"
    if metric == "speedup":
        return f"{value:.2f}x"
    if metric.startswith("t_"):
        if unit == "s":
            return f"{value:.3f}s"
        ms = value * 1e3
        return f"{ms:.1f}ms" if abs(ms) >= 100 else f"{ms:.2f}ms" if abs(ms) >= 1 else f"{ms:.3f}ms"
    if metric in ("E", "E_pred", "tokens_per_s"):
        return f"{value:.1f}"
    if metric in ("expert_bytes_per_step", "expert_bytes_per_step_loaded"):
        return f"{value / 2**20:.1f}MiB"
    if metric == "predictor_accuracy":
        return f"{value:.3f}"
    return f"{value:.2f}"


def _value(block: Block, method: str, metric: str, datasets: Sequence[str]) -> float | None:
    """Mean of ``metric`` of ``method`` over ``datasets`` (``None`` when no cell has it)."""
    if method in block.ar_methods and metric == "speedup":
        return 1.0
    vals = [block.cells[(method, d)].metrics[metric] for d in datasets
            if (method, d) in block.cells and metric in block.cells[(method, d)].metrics]
    return _mean(vals)


def _show(block: Block, method: str, metric: str, value: float | None, unit: str = "s") -> str:
    if method in block.ar_methods and metric in _NOT_AR:
        return "-"
    if metric in ("t_pred", "t_draft", "t_select") and value == 0:
        return "-"  # no predictor / drafter in this method
    return _fmt(metric, value, unit)


def _time_unit(block: Block) -> str:
    """One unit per table: milliseconds unless some step takes a second or more."""
    times = [v for c in block.cells.values() for k, v in c.metrics.items() if k.startswith("t_")]
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
    title = f"Table 1 — {block.title} — cells: {' / '.join(_LABELS.get(k, k) for k in metrics)}"
    return Table(title, columns, rows, records, _notes(block, None))


def table3(block: Block) -> Table:
    """Latency breakdown per method, averaged over the block's datasets (seconds per step)."""
    columns = ["Method", "E", "T_pred", "T_draft", "T_verify", "T_total", "α", "Speedup"]
    rows, records = [], []
    unit = _time_unit(block)
    for m in block.methods:
        vals = {k: _value(block, m, k, block.datasets) for k in TABLE3_METRICS}
        if m in block.ar_methods:
            vals["alpha"] = 1.0
        cells = [_show(block, m, k, v, unit) for k, v in vals.items()]
        if m in block.ar_methods:
            cells[TABLE3_METRICS.index("alpha")] = "1.00"
            cells[TABLE3_METRICS.index("t_total")] += "†"
        rows.append([_method_label(block, m), *cells])
        records.append({"table": "table3", "temperature": block.temperature, "budget": block.budget,
                        "batch_size": block.batch_size, "method": m, "dataset": "Average", **vals})
    title = f"Table 3 — latency breakdown per step, mean over {len(block.datasets)} datasets — {block.title}"
    return Table(title, columns, rows, records,
                 _notes(block, "† AR: T_total is the per-token latency (one token per step)"))


def build_tables(cells: Iterable[Cell], metrics: Sequence[str] = DEFAULT_METRICS) -> list[Table]:
    """Table 1 for every block, then Table 3 for every block."""
    bad = [m for m in metrics if m not in CELL_METRICS]
    if bad:
        raise UserError(f"unknown metric(s) {', '.join(bad)} for --metric; "
                        f"choose from {', '.join(CELL_METRICS)}")
    blocks = group_blocks(cells)
    return [table1(b, metrics) for b in blocks] + [table3(b) for b in blocks]


def speedup_by_gamma(cells: Iterable[Cell], temperature: float = 0.0, batch_size: int = 1,
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
    records = [r for t in tables for r in t.records]
    cols: dict[str, None] = {}
    for r in records:
        cols.update(dict.fromkeys(r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(cols), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in records)
    return buf.getvalue()


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


def log_comparison(tracker: Any, parent_run_id: str | None,
                   metrics: Sequence[str] = DEFAULT_METRICS, artifact_dir: str = "comparison") -> str:
    """Log Table 1/3 of the parent run's cells as ``comparison/tables.md`` and ``comparison/tables.csv``
    artifacts of that parent run; returns the markdown ("" with a disabled tracker or no cells yet)."""
    if not getattr(tracker, "enabled", False) or not parent_run_id:
        return ""
    try:
        tables = build_tables(load_cells(tracker.uri, tracker.experiment_name, run_id=parent_run_id), metrics)
    except UserError as exc:
        logger.warning("no comparison logged: %s", exc)
        return ""
    md = render(tables, "markdown")
    tracker.client.log_text(parent_run_id, md, f"{artifact_dir}/tables.md")
    tracker.client.log_text(parent_run_id, render(tables, "csv"), f"{artifact_dir}/tables.csv")
    return md
