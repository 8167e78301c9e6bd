# SPDX-License-Identifier: Apache-2.0
"""Evaluation reporting: the paper's Table 1/3 for this run's cells, nested MLflow cell runs, plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

__all__ = ["to_compare_cells", "cells_table", "log_cell", "log_summary"]


def to_compare_cells(cells: list[dict[str, Any]]) -> list[Any]:
    """Evaluation results -> :class:`specmoe.tracking.compare.Cell` records (same tables as ``compare``)."""
    from specmoe.tracking.compare import Cell

    out = []
    for i, c in enumerate(cells):
        s = c["spec"]
        out.append(Cell(run_id=c.get("run_id", ""), parent="", method=s["method"], dataset=s["dataset"],
                        temperature=float(s["temperature"]), budget=int(s["budget"]),
                        batch_size=int(s["batch_size"]), start_time=i, metrics=dict(c["metrics"]),
                        ar=bool(c["autoregressive"]), analysis_only=bool(c["analysis_only"])))
    return out


def cells_table(cells: list[dict[str, Any]], fmt: str = "text") -> str:
    """Table 1 (Spd / alpha / E per method x dataset, with Average) and Table 3 (latency breakdown)."""
    from specmoe.tracking.compare import build_tables, render

    return render(build_tables(to_compare_cells(cells)), fmt)


def log_cell(tracker: Any, parent: Any, cell: dict[str, Any], decode: Callable[[list[int]], str]) -> None:
    """One nested run per cell (skipped when this parent already holds a finished one)."""
    from specmoe.tracking.tracker import CELL_METRICS, cell_run_name, cell_tags

    s = cell["spec"]
    tags = cell_tags(s["method"], s["dataset"], s["temperature"], s["budget"], s["batch_size"],
                     parent=parent.run_id)
    found = tracker.find_run(tags)
    if found is not None:
        cell["run_id"] = found.run_id
        return
    tags["specmoe.ar"] = str(bool(cell["autoregressive"])).lower()
    tags["specmoe.analysis_only"] = str(bool(cell["analysis_only"])).lower()
    tags["specmoe.cached"] = str(bool(cell.get("cached"))).lower()
    with tracker.run(cell_run_name(tags), tags=tags, parent_run_id=parent.run_id) as run:
        cell["run_id"] = run.run_id
        metrics = {k: v for k, v in cell["metrics"].items() if isinstance(v, (int, float))}
        run.log_metrics(metrics)
        run.log_params({"cell_key": cell.get("key", ""), **{f"spec.{k}": v for k, v in s.items()}})
        run.log_table(cell["steps"], "steps.csv")
        run.log_table(cell["per_sample"], "per_sample.csv")
        run.log_dict({"outputs": [{"id": o["id"], "turns": o["turns"]} for o in cell["outputs"]]}, "outputs.json")
        missing = [k for k in CELL_METRICS if k not in metrics]
        if missing:
            run.set_tags({"specmoe.metrics_not_applicable": ",".join(missing)})


def log_summary(tracker: Any, parent: Any, cells: list[dict[str, Any]], out_dir: Path) -> None:
    """Plots (Fig. 1a, 1b, 4, speedup vs gamma) into ``out_dir`` and the parent run, plus the comparison."""
    from specmoe.tracking import plots
    from specmoe.tracking.compare import log_comparison, speedup_by_gamma

    by_method: dict[str, list[dict[str, Any]]] = {}
    counts: dict[str, list[list[int]]] = {}
    for c in cells:
        if c["spec"]["temperature"] != 0 or c["spec"]["batch_size"] != 1:
            continue
        by_method.setdefault(c["spec"]["method"], []).extend(c["steps"])
        if c.get("expert_counts") and not c["autoregressive"]:
            prev = counts.get(c["spec"]["method"])
            cur = c["expert_counts"]
            counts[c["spec"]["method"]] = cur if prev is None else [
                [a + b for a, b in zip(r1, r2)] for r1, r2 in zip(prev, cur)]
    figs = {}
    if by_method:
        figs["fig1a_latency_vs_experts.png"] = plots.fig_latency_vs_experts(by_method)
        spec_only = {m: r for m, r in by_method.items() if any(s.get("cumulative_experts") for s in r)}
        if spec_only:
            figs["fig1b_cumulative_experts.png"] = plots.fig_cumulative_experts(spec_only)
    for m, cnt in counts.items():
        figs[f"fig4_expert_heatmap_{m}.png"] = plots.fig_expert_heatmap(cnt, title=f"expert activations: {m}")
    gam = speedup_by_gamma(to_compare_cells(cells))
    if any(len(v) > 1 for v in gam.values()):
        figs["speedup_vs_gamma.png"] = plots.fig_speedup_vs_gamma(gam)
    plot_dir = out_dir / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    for name, fig in figs.items():
        fig.savefig(plot_dir / name, dpi=110, bbox_inches="tight")
        if parent is not None and getattr(tracker, "enabled", False):
            parent.log_artifact(plot_dir / name, "plots")
    if parent is not None and getattr(tracker, "enabled", False):
        parent.log_text(cells_table(cells, "markdown"), "results/table.md")
        log_comparison(tracker, parent.run_id)
