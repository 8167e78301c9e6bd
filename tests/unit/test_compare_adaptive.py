# SPDX-License-Identifier: Apache-2.0
"""Adaptive methods in reports: a cell's calibration reaches MLflow (metrics, calibration.json, plot) and
``platform compare`` sets each adaptive method next to the best fixed-γ method of its cell."""

from __future__ import annotations

import time

from specmoe.config.schema import TrackingConfig
from specmoe.evaluation.report import calibration_metrics, log_cell
from specmoe.evaluation.report_tables import compare
from specmoe.evaluation.results import CellResult
from specmoe.tracking import Tracker

CAL = {"cost": {"coef": {"fixed": 1e-3, "tokens": 2e-4}, "median_abs_rel_error": 0.05, "p90_abs_rel_error": 0.2,
                "n": 3, "heldout": {"median_abs_rel_error": 0.08, "p90_abs_rel_error": 0.3, "n": 3},
                "predicted": [1e-3, 2e-3, 3e-3], "measured": [1.1e-3, 1.9e-3, 3.2e-3]},
       "acceptance": {"0.0": {"weights": [0.0, 1.0, 0.0], "brier": 0.1, "ece": 0.04, "n": 50}},
       "ar_floor": {"speculate": 7, "fall_back": 2}}
# (method, budget, dataset) -> speedup; AR is 1
SPEEDUPS = {("eagle3", 2, "gsm8k"): 1.05, ("eagle3", 2, "mt_bench"): 1.20,
            ("eagle3", 6, "gsm8k"): 1.15, ("eagle3", 6, "mt_bench"): 1.00,
            ("oracle", 4, "gsm8k"): 3.00, ("oracle", 4, "mt_bench"): 3.00,  # analysis only: never the best
            ("goodput", 8, "gsm8k"): 1.18, ("goodput", 8, "mt_bench"): 1.14}


def test_calibration_metrics_flatten():
    m = calibration_metrics(CAL)
    assert m["cost.coef.tokens"] == 2e-4 and m["cost.heldout.median_abs_rel_error"] == 0.08
    assert m["cost.window.median_abs_rel_error"] == 0.05 and m["acceptance.T0.0.ece"] == 0.04
    assert m["ar_floor.fall_back"] == 2.0 and "cost.window.predicted" not in m


def test_adaptive_next_to_best_fixed(tmp_path):
    tracker = Tracker.from_config(TrackingConfig(uri=f"sqlite:///{tmp_path}/mlflow.db"), "ad", tmp_path)
    with tracker.run("recipe") as parent:
        for ds in ("gsm8k", "mt_bench"):
            log_cell(tracker, parent, CellResult("ar", ds, 0.0, 1, 2, {"speedup": 1.0}, autoregressive=True))
            time.sleep(0.003)
        for (method, g, ds), spd in SPEEDUPS.items():
            cell = CellResult(method, ds, 0.0, g, 2, {"speedup": spd}, adaptive=method == "goodput",
                              analysis_only=method == "oracle", calibration=CAL if method == "goodput" else None)
            log_cell(tracker, parent, cell)
            time.sleep(0.003)
    text = compare(tracker.uri, "ad")
    block = next(b for b in text.split("\n\n") if b.startswith("Adaptive vs best fixed γ"))
    lines = block.splitlines()
    assert lines[0] == "Adaptive vs best fixed γ — T=0 (greedy), batch size 2 — speedup over AR"
    best = lines[3].split("  ")
    assert [c.strip() for c in best if c.strip()] == ["best fixed γ", "1.15x eagle3@6", "1.20x eagle3@2",
                                                     "1.12x eagle3@2"]
    good = [c.strip() for c in lines[4].split("  ") if c.strip()]
    assert good == ["goodput@8", "1.18x (1.03x best)", "1.14x (0.95x best)", "1.16x (1.03x best)"]

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracker.uri)
    run = next(r for r in client.search_runs([client.get_experiment_by_name("ad").experiment_id])
               if r.data.tags.get("specmoe.method") == "goodput")
    assert run.data.tags["specmoe.adaptive"] == "true"
    assert run.data.metrics["cost.heldout.median_abs_rel_error"] == 0.08
    arts = {a.path for a in client.list_artifacts(run.info.run_id)} | {
        a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert "calibration.json" in arts and "plots/cost_fit.png" in arts


def test_cell_of_an_adaptive_method_keeps_its_calibration(make_target):
    """Evaluation path: a goodput method's batches record the selector's calibration and the AR floor's
    decisions; the cell keeps the last batch's and is flagged adaptive; a fixed selector's cell has none."""
    from specmoe.config.schema import Component, MethodConfig
    from specmoe.decoding.settings import DecodeSettings
    from specmoe.decoding.stopping import StopRule
    from specmoe.evaluation.cell import build_cell, run_batch
    from specmoe.evaluation.method import Method
    from specmoe.interfaces.dataset import Sample

    target = make_target("qwen3_moe")
    drafter = Component("draft_model", {"share_target": True}, "drafter")
    settings = DecodeSettings(budget=4, temperature=0.0, steps=2, top_k=2, stop=StopRule(12), seed=0)
    render = lambda s, turn, prev: [3 + int(s.id), 5, 7, 11]  # noqa: E731
    for sel, adaptive in (("goodput", True), ("confidence", False)):
        cfg = MethodConfig(name=sel, drafter=drafter, selector=Component(sel, {"expert_cost": False}
                                                                          if adaptive else {}, "selector"))
        method = Method(cfg, target, lambda x: x)
        assert method.adaptive == adaptive
        batches = [run_batch(method, [Sample(str(i), ["q"])], render, str, settings) for i in range(2)]
        cell, _ = build_cell(batches, method=sel, dataset="d", temperature=0.0, budget=4, batch_size=1,
                             autoregressive=False, analysis_only=False, bytes_per_expert=1, num_moe_layers=1,
                             adaptive=method.adaptive)
        assert cell.adaptive == adaptive
        if adaptive:
            spec = sum(s["speculative"] for b in batches for s in b["steps"])
            ar = sum(sum(not s["speculative"] for s in b["steps"]) // 8 for b in batches)
            assert cell.calibration["cost"]["n"] == spec + ar  # the passes of both batches it was shown
            assert sum(cell.calibration["ar_floor"].values()) >= 1
            assert cell.calibration is batches[-1]["calibration"]
        else:
            assert cell.calibration is None and "calibration" not in batches[0]
