# SPDX-License-Identifier: Apache-2.0
"""Evaluation reporting: nested MLflow cell runs, the comparison tables (built once), plots."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from specmoe.evaluation.results import CellResult
from specmoe.tracking.schema import BATCHES_ARTIFACT, PROMPT_BATCHES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from specmoe.evaluation.report_tables import Table
    from specmoe.tracking.client import NullTracker, RunHandle, Tracker

__all__ = ["build_report_tables", "log_cell", "log_summary", "write_results", "calibration_metrics",
           "interval_metrics", "BATCHES_ARTIFACT", "PROMPT_BATCHES"]


def interval_metrics(cell: CellResult) -> dict[str, float]:
    """``<metric>_lo`` / ``<metric>_hi`` for every interval of the cell, and its ``prompt_batches``."""
    out = {f"{k}_{side}": v for k, (lo, hi) in cell.intervals.items() for side, v in (("lo", lo), ("hi", hi))}
    if cell.prompt_batches:
        out[PROMPT_BATCHES] = float(cell.prompt_batches)
    return out


def build_report_tables(cells: Sequence[CellResult]) -> list[Table]:
    """Table 1 and Table 3 of this run's cells (:func:`specmoe.evaluation.report_tables.build_tables`)."""
    from specmoe.evaluation.report_tables import build_tables

    return build_tables(cells)


def write_results(cells: Sequence[CellResult], tables: list[Table], out: Path) -> str:
    """``results.json`` (metrics, intervals and level, verdict against AR), ``samples_*.jsonl`` (outputs) and
    ``table.md`` under ``out``; returns the text rendering of the tables."""
    import json

    from specmoe.evaluation.report_tables import render
    from specmoe.utils.files import atomic_write

    out.mkdir(parents=True, exist_ok=True)
    from specmoe.evaluation.stats import LEVEL

    records = [{**c.to_json(bulky=False), "confidence_level": LEVEL,
                **({} if c.autoregressive or "speedup" not in c.intervals else
                   {"verdict_vs_ar": c.interval("speedup").verdict()})} for c in cells]
    atomic_write(out / "results.json", json.dumps(records, indent=2, default=str))
    for c in cells:
        name = f"samples_{c.method}_{c.dataset}_T{c.temperature}_g{c.budget}_bs{c.batch_size}"
        atomic_write(out / f"{name}.jsonl", "".join(json.dumps({"id": o["id"], "turns": o["turns"]}) + "\n"
                                                    for o in c.outputs))
    atomic_write(out / "table.md", render(tables, "markdown"))
    return render(tables, "text")


def log_cell(tracker: Tracker | NullTracker, parent: RunHandle, cell: CellResult) -> None:
    """One nested run per cell (skipped when this parent already holds a finished one)."""
    from specmoe.metrics import names
    from specmoe.tracking.schema import cell_run_name, cell_tags

    tags = cell_tags(cell.method, cell.dataset, cell.temperature, cell.budget, cell.batch_size,
                     parent=parent.run_id)
    found = tracker.find_run(tags)
    if found is not None:
        cell.run_id = found.run_id
        return
    tags["specmoe.ar"] = str(cell.autoregressive).lower()
    tags["specmoe.analysis_only"] = str(cell.analysis_only).lower()
    tags["specmoe.cached"] = str(cell.cached).lower()
    tags["specmoe.adaptive"] = str(cell.adaptive).lower()
    with tracker.run(cell_run_name(tags), tags=tags, parent_run_id=parent.run_id) as run:
        cell.run_id = run.run_id or ""
        known = names()
        run.log_metrics({k: v for k, v in cell.metrics.items() if k in known})
        run.log_metrics(interval_metrics(cell))
        run.log_params({"group_key": cell.key, "spec.method": cell.method, "spec.dataset": cell.dataset,
                        "spec.temperature": cell.temperature, "spec.budget": cell.budget,
                        "spec.batch_size": cell.batch_size})
        run.log_table(cell.steps, "steps.csv")
        run.log_table(cell.per_sample, "per_sample.csv")
        if cell.batches:
            run.log_dict({"batches": cell.batches}, BATCHES_ARTIFACT)
        run.log_dict({"outputs": [{"id": o["id"], "turns": o["turns"]} for o in cell.outputs]}, "outputs.json")
        if cell.calibration:
            _log_calibration(run, cell)
        missing = [k for k in known if k not in cell.metrics]
        if missing:
            run.set_tags({"specmoe.metrics_not_applicable": ",".join(missing)})


def calibration_metrics(cal: dict[str, Any]) -> dict[str, float]:
    """Flat MLflow metrics of a calibration: ``cost.coef.<feature>``, ``cost.window.<error>``,
    ``cost.heldout.<error>``, ``acceptance.T<t>.<brier|ece|n>``, ``ar_floor.<decision>``."""
    out: dict[str, float] = {}
    cost = cal.get("cost", {})
    out.update({f"cost.coef.{k}": v for k, v in cost.get("coef", {}).items()})
    out.update({f"cost.window.{k}": v for k, v in cost.items() if isinstance(v, (int, float))})
    out.update({f"cost.heldout.{k}": v for k, v in cost.get("heldout", {}).items()})
    for t, acc in cal.get("acceptance", {}).items():
        out.update({f"acceptance.T{t}.{k}": v for k, v in acc.items() if isinstance(v, (int, float))})
    out.update({f"ar_floor.{k}": v for k, v in cal.get("ar_floor", {}).items()})
    return {k: float(v) for k, v in out.items() if v is not None and v == v}  # NaN: no data


def _log_calibration(run: RunHandle, cell: CellResult) -> None:
    """Calibration metrics, ``calibration.json`` and a predicted-vs-measured T_verify plot into ``run``."""
    from specmoe.evaluation import report_plots as plots

    cal = cell.calibration or {}
    run.log_metrics(calibration_metrics(cal))
    run.log_dict(cal, "calibration.json")
    cost = cal.get("cost", {})
    if cost.get("measured"):
        run.log_figure(plots.fig_cost_fit(cost["predicted"], cost["measured"], title=f"cost model: {cell.label}"),
                       "plots/cost_fit.png")


def _figures(cells: Sequence[CellResult]) -> dict[str, Figure]:
    from specmoe.evaluation import report_plots as plots
    from specmoe.evaluation.cell import add_counts
    from specmoe.evaluation.report_tables import speedup_by_gamma, speedup_intervals_by_gamma

    by_method: dict[str, list[dict[str, Any]]] = {}
    counts: dict[str, list[list[int]] | None] = {}
    for c in cells:
        if c.temperature != 0 or c.batch_size != 1:
            continue
        by_method.setdefault(c.method, []).extend(c.steps)
        if c.expert_counts and not c.autoregressive:
            counts[c.method] = add_counts(counts.get(c.method), c.expert_counts)
    figs = {}
    if by_method:
        figs["fig1a_latency_vs_experts.png"] = plots.fig_latency_vs_experts(by_method)
        spec_only = {m: r for m, r in by_method.items() if any(s.get("cumulative_experts") for s in r)}
        if spec_only:
            figs["fig1b_cumulative_experts.png"] = plots.fig_cumulative_experts(spec_only)
    for m, cnt in counts.items():
        figs[f"fig4_expert_heatmap_{m}.png"] = plots.fig_expert_heatmap(cnt, title=f"expert activations: {m}")
    gam = speedup_by_gamma(cells)
    if any(len(v) > 1 for v in gam.values()):
        figs["speedup_vs_gamma.png"] = plots.fig_speedup_vs_gamma(gam, intervals=speedup_intervals_by_gamma(cells))
    return figs


def log_summary(tracker: Tracker | NullTracker, parent: RunHandle | None, cells: Sequence[CellResult],
                tables: list[Table], out_dir: Path) -> None:
    """Plots (Fig. 1a, 1b, 4, speedup vs γ) into ``out_dir/plots`` and the parent run, and the comparison
    tables (built once, by the caller) as ``comparison/tables.md`` and ``comparison/tables.csv``."""
    from specmoe.evaluation.report_tables import render

    plot_dir = out_dir / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    logging_on = parent is not None and getattr(tracker, "enabled", False)
    for name, fig in _figures(cells).items():
        fig.savefig(plot_dir / name, dpi=110, bbox_inches="tight")
        if logging_on:
            parent.log_artifact(plot_dir / name, "plots")
    if logging_on and tables:
        parent.log_text(render(tables, "markdown"), "comparison/tables.md")
        parent.log_text(render(tables, "csv"), "comparison/tables.csv")
