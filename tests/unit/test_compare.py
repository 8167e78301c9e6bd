# SPDX-License-Identifier: Apache-2.0
"""``platform compare``: Table 1 / Table 3 from synthetic cell runs in a real sqlite MLflow store."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import time

import pytest

from specmoe.cli.ui import ui_command
from specmoe.config.schema import TrackingConfig
from specmoe.errors import UserError
from specmoe.evaluation.report_tables import (
    build_tables,
    compare,
    load_cells,
    render,
    resolve_uri,
    speedup_by_gamma,
)
from specmoe.evaluation.results import CellResult
from specmoe.tracking import Tracker, cell_run_name, cell_tags

# (method, dataset) -> metrics at T=0; T=1 uses speedup - 0.1 and E + 1
T0 = {
    ("ar", "gsm8k"): {"speedup": 1.0, "alpha": 1.0, "E": 8.0, "t_verify": 0.05, "t_total": 0.05},
    ("ar", "humaneval"): {"speedup": 1.0, "alpha": 1.0, "E": 8.0, "t_verify": 0.05, "t_total": 0.07},
    ("eagle3", "gsm8k"): {
        "speedup": 1.31,
        "alpha": 2.54,
        "E": 22.3,
        "t_pred": 0.0,
        "t_draft": 0.008,
        "t_verify": 0.832,
        "t_total": 0.840,
    },
    ("eagle3", "humaneval"): {
        "speedup": 1.11,
        "alpha": 2.36,
        "E": 26.1,
        "t_pred": 0.0,
        "t_draft": 0.008,
        "t_verify": 0.812,
        "t_total": 0.820,
    },
    ("ecospec", "gsm8k"): {
        "speedup": 1.39,
        "alpha": 2.54,
        "E": 21.0,
        "t_pred": 0.004,
        "t_draft": 0.008,
        "t_verify": 0.730,
        "t_total": 0.742,
    },
    ("ecospec", "humaneval"): {
        "speedup": 1.33,
        "alpha": 2.32,
        "E": 21.6,
        "t_pred": 0.004,
        "t_draft": 0.008,
        "t_verify": 0.710,
        "t_total": 0.722,
    },
}
EXPERIMENT = "cmp"


def _log_cells(
    tracker: Tracker, parent_id: str, temps: list[float], values: dict, fail: bool = False
) -> None:
    for temp in temps:
        for (method, ds), metrics in values.items():
            tags = cell_tags(method, ds, temp, 1 if method == "ar" else 4, 1, parent=parent_id)
            m = dict(metrics)
            if temp > 0 and method != "ar":
                m.update(speedup=m["speedup"] - 0.1, E=m["E"] + 1)
            with tracker.run(cell_run_name(tags), tags=tags, parent_run_id=parent_id) as cell:
                cell.log_metrics(m)
            time.sleep(0.003)  # distinct start times keep the run order
    if fail:
        with pytest.raises(RuntimeError):
            tags = cell_tags("ecospec", "crashed_ds", 0.0, 4, 1, parent=parent_id)
            with tracker.run(cell_run_name(tags), tags=tags, parent_run_id=parent_id) as cell:
                cell.log_metrics({"speedup": 5.0})
                raise RuntimeError("cuda oom")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    workdir = tmp_path_factory.mktemp("cmp")
    tracker = Tracker.from_config(TrackingConfig(uri=f"sqlite:///{workdir}/mlflow.db"), EXPERIMENT, workdir)
    with tracker.run("old") as old:  # an earlier recipe run with other numbers and a third dataset
        _log_cells(
            tracker,
            old.run_id,
            [0.0],
            {
                ("ecospec", "gsm8k"): {"speedup": 9.99, "alpha": 9.0, "E": 9.0},
                ("ecospec", "mt_bench"): {"speedup": 1.5, "alpha": 2.0, "E": 20.0},
            },
        )
    with tracker.run("new") as new:
        _log_cells(tracker, new.run_id, [0.0, 1.0], T0, fail=True)
    return {"tracker": tracker, "uri": tracker.uri, "old": old.run_id, "new": new.run_id, "workdir": workdir}


def _rows(text: str, title_start: str) -> dict[str, list[str]]:
    """Rows of the text table whose title starts with ``title_start``: method -> cells."""
    lines = text.split("\n\n")
    block = next(b for b in lines if b.startswith(title_start)).splitlines()
    return {
        ln.split()[0]: [c.strip() for c in ln.split("  ")[1:] if c.strip()]
        for ln in block[3:]
        if ln and not ln.startswith(("*", "†"))
    }


def test_latest_parent_table1_text(runs):
    text = compare(runs["uri"], EXPERIMENT)
    assert text.startswith("Table 1 — T=0 (greedy), γ=4, batch size 1 — cells: Spd / α / E")
    header = text.splitlines()[1].split()
    assert header == [
        "Method",
        "gsm8k",
        "humaneval",
        "Average",
    ]  # old run's mt_bench and the failed cell absent
    t0 = _rows(text, "Table 1 — T=0")
    assert list(t0) == ["ar", "eagle3", "ecospec"]
    assert t0["ar"] == ["1.00x / - / 8.0"] * 3
    assert t0["eagle3"] == ["1.31x / 2.54 / 22.3", "1.11x / 2.36 / 26.1", "1.21x / 2.45 / 24.2"]
    assert t0["ecospec"] == ["1.39x / 2.54 / 21.0", "1.33x / 2.32 / 21.6", "1.36x / 2.43 / 21.3"]
    t1 = _rows(text, "Table 1 — T=1 (sampling)")
    assert t1["ecospec"] == ["1.29x / 2.54 / 22.0", "1.23x / 2.32 / 22.6", "1.26x / 2.43 / 22.3"]
    assert "crashed_ds" not in text and "9.99" not in text


def test_table3_text(runs):
    text = compare(runs["uri"], EXPERIMENT)
    block = next(b for b in text.split("\n\n") if b.startswith("Table 3") and "T=0" in b)
    assert block.splitlines()[1].split() == [
        "Method",
        "E",
        "T_pred",
        "T_draft",
        "T_verify",
        "T_total",
        "α",
        "Spd",
    ]
    rows = _rows(text, block.splitlines()[0])
    assert rows["ar"] == ["8.0", "-", "-", "-", "60.00ms†", "1.00", "1.00x"]
    assert rows["eagle3"] == ["24.2", "-", "8.00ms", "822.0ms", "830.0ms", "2.45", "1.21x"]
    assert rows["ecospec"] == ["21.3", "4.00ms", "8.00ms", "720.0ms", "732.0ms", "2.43", "1.36x"]
    assert "† AR: T_total is the per-token latency" in block


def test_metric_selection_and_bad_metric(runs):
    text = compare(runs["uri"], EXPERIMENT, metrics=["E", "t_verify"])
    assert "cells: E / T_verify" in text
    assert _rows(text, "Table 1 — T=0")["ecospec"][0] == "21.0 / 730.0ms"
    with pytest.raises(UserError, match="unknown metric"):
        compare(runs["uri"], EXPERIMENT, metrics=["speed"])


def test_markdown(runs):
    md = compare(runs["uri"], EXPERIMENT, fmt="markdown")
    assert "### Table 1 — T=0 (greedy), γ=4, batch size 1 — cells: Spd / α / E" in md
    assert "| Method | gsm8k | humaneval | Average |\n|---|---:|---:|---:|" in md
    assert "| ecospec | 1.39x / 2.54 / 21.0 | 1.33x / 2.32 / 21.6 | 1.36x / 2.43 / 21.3 |" in md
    assert "| ar | 8.0 | - | - | - | 60.00ms† | 1.00 | 1.00x |" in md


def test_csv_and_average_math(runs):
    records = list(csv.DictReader(io.StringIO(compare(runs["uri"], EXPERIMENT, fmt="csv"))))
    t1 = [r for r in records if r["table"] == "table1"]
    t3 = [r for r in records if r["table"] == "table3"]
    assert len(t1) == 2 * 3 * 3 and len(t3) == 2 * 3  # temps x methods x (datasets + Average)
    avg = {(float(r["temperature"]), r["method"]): r for r in t1 if r["dataset"] == "Average"}
    for method in ("eagle3", "ecospec"):
        for key in ("speedup", "alpha", "E"):
            mean = (T0[(method, "gsm8k")][key] + T0[(method, "humaneval")][key]) / 2
            assert float(avg[(0.0, method)][key]) == pytest.approx(mean)
        assert float(avg[(1.0, method)]["speedup"]) == pytest.approx(
            (T0[(method, "gsm8k")]["speedup"] + T0[(method, "humaneval")]["speedup"]) / 2 - 0.1
        )
    eco3 = next(r for r in t3 if r["method"] == "ecospec" and float(r["temperature"]) == 0)
    assert float(eco3["t_verify"]) == pytest.approx(0.72) and float(eco3["t_total"]) == pytest.approx(0.732)
    ar3 = next(r for r in t3 if r["method"] == "ar" and float(r["temperature"]) == 0)
    assert ar3["t_pred"] == "" and float(ar3["speedup"]) == 1.0


def test_run_selection(runs):
    old = load_cells(runs["uri"], EXPERIMENT, run_id=runs["old"])
    assert {(c.method, c.dataset) for c in old} == {("ecospec", "gsm8k"), ("ecospec", "mt_bench")}
    both = compare(runs["uri"], EXPERIMENT, all_runs=True)
    t0 = _rows(both, "Table 1 — T=0")
    assert both.splitlines()[1].split() == ["Method", "gsm8k", "mt_bench", "humaneval", "Average"]
    assert t0["ecospec"][:2] == ["1.39x / 2.54 / 21.0", "1.50x / 2.00 / 20.0"]  # newest gsm8k cell wins
    assert t0["eagle3"][1] == "n/a"
    with pytest.raises(UserError, match="no finished cell runs"):
        load_cells(runs["uri"], EXPERIMENT, run_id="0" * 32)
    with pytest.raises(UserError, match="experiment 'nope' not found.*cmp"):
        load_cells(runs["uri"], "nope")


def _cell(method, ds, temperature, budget, metrics, ar=False, analysis=False, order=0):
    return CellResult(method, ds, temperature, budget, 1, metrics, autoregressive=ar, analysis_only=analysis,
                      run_id="id", parent="p", order=order)


def test_analysis_only_and_ar_tag():
    def cell(method, ds, spd, ar=False, analysis=False):
        return _cell(method, ds, 0.0, 1 if ar else 4, {"speedup": spd, "alpha": 2.0, "E": 10.0}, ar, analysis)

    tables = build_tables(
        [
            cell("eco", "a", 1.2),
            cell("oracle", "a", 1.5, analysis=True),
            cell("Baseline", "a", 1.0, ar=True),
            cell("eco", "b", 1.4),
        ]
    )
    text = render(tables, "text")
    rows = _rows(text, "Table 1")
    assert list(rows) == ["Baseline", "eco", "oracle*"]
    assert rows["oracle*"] == ["1.50x / 2.00 / 10.0", "n/a", "1.50x / 2.00 / 10.0"]
    assert rows["eco"][2] == "1.30x / 2.00 / 10.0"
    assert "* analysis only" in text


def test_one_table_per_setting_ar_shared_across_budgets_and_small_times():
    def cell(method, ds, budget, t_pred, ar=False):
        metrics = {"speedup": 1.2, "alpha": 2.0, "E": 10.0, "t_pred": t_pred, "t_total": 0.004}
        return _cell(method, ds, 0.0, budget, metrics, ar)

    # AR is measured once per (T, batch size) with γ = 1: it joins every γ's table, and makes none of its own
    cells = [cell("ar", "a", 1, 0.0, ar=True), cell("ar", "zz", 1, 0.0, ar=True),
             cell("eco", "a", 3, 1.23e-5), cell("eco", "a", 4, 2e-3)]
    text = render(build_tables(cells), "text")
    titles = [b.splitlines()[0] for b in text.split("\n\n")]
    assert [t for t in titles if t.startswith("Table 1")] == [
        "Table 1 — T=0 (greedy), γ=3, batch size 1 — cells: Spd / α / E",
        "Table 1 — T=0 (greedy), γ=4, batch size 1 — cells: Spd / α / E"]
    g3 = next(b for b in text.split("\n\n") if b.startswith("Table 1") and "γ=3" in b)
    assert g3.splitlines()[1].split() == ["Method", "a", "Average"]  # the AR-only dataset is not added
    assert _rows(text, g3.splitlines()[0])["ar"] == ["1.00x / - / 10.0"] * 2
    t3 = next(b for b in text.split("\n\n") if b.startswith("Table 3") and "γ=3" in b)
    assert _rows(text, t3.splitlines()[0])["eco"][1:5] == ["0.012ms", "n/a", "n/a", "4.00ms"]
    only_ar = render(build_tables([cell("ar", "a", 1, 0.0, ar=True)]), "text")
    assert only_ar.startswith("Table 1 — T=0 (greedy), batch size 1")  # no γ for AR alone


def test_speedup_by_gamma():
    cells = [
        _cell(m, ds, t, g, {"speedup": spd})
        for m, ds, t, g, spd in [
            ("eco", "a", 0.0, 3, 1.2),
            ("eco", "b", 0.0, 3, 1.4),
            ("eco", "a", 0.0, 4, 1.5),
            ("eco", "a", 1.0, 4, 9.0),
            ("ar", "a", 0.0, 1, 1.0),
        ]
    ]
    cells[-1].autoregressive = True
    assert speedup_by_gamma(cells) == {"eco": {3: pytest.approx(1.3), 4: 1.5}}
    assert speedup_by_gamma(cells, temperature=1.0) == {"eco": {4: 9.0}}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}


def test_cli_in_another_process(runs, tmp_path):
    out = tmp_path / "t.csv"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specmoe",
            "compare",
            "--experiment",
            EXPERIMENT,
            "--uri",
            runs["uri"],
            "--format",
            "csv",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == proc.stdout
    assert proc.stdout.startswith("table,temperature,budget,batch_size,method,dataset,speedup,alpha,E")
    # default store: ./mlflow.db of the working directory
    proc = subprocess.run(
        [sys.executable, "-m", "specmoe", "compare", "--experiment", EXPERIMENT, "--run-id", runs["old"]],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=runs["workdir"],
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert "9.99x / 9.00 / 9.0" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "specmoe", "compare", "--experiment", EXPERIMENT],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=_env(),
    )
    assert proc.returncode == 2 and "no MLflow store found" in proc.stderr


def test_resolve_uri_and_ui_command(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(UserError, match="--uri"):
        resolve_uri(None, tmp_path)
    (tmp_path / "mlflow.db").touch()
    assert resolve_uri(None, tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://srv:5000")
    assert resolve_uri(None, tmp_path) == "http://srv:5000"
    assert resolve_uri("sqlite:////a.db", tmp_path) == "sqlite:////a.db"
    cmd = ui_command("sqlite:////a.db", 5123, workers=2)
    assert cmd[1:] == [
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        "sqlite:////a.db",
        "--host",
        "127.0.0.1",
        "--port",
        "5123",
        "--workers",
        "2",
    ]


def test_a_real_evaluation_prints_intervals_and_verdicts(tmp_path, monkeypatch):
    """`platform run` of a tiny grid (5 prompt batches, AR + two methods), then `platform compare` on its
    MLflow store in another process: intervals in Table 1, the level in the title, verdicts per cell; the
    cells' per-batch values reproduce their metrics and their intervals hold them."""
    import json
    import textwrap
    from pathlib import Path

    from specmoe.api import run
    from specmoe.config.load import load_recipe
    from specmoe_plugins.targets.tiny.tokenizer import train_bpe_tokenizer

    data = Path(__file__).resolve().parents[3] / "shared" / "data"
    lines = [json.loads(x) for x in (data / "gsm8k" / "train.jsonl").read_text().splitlines()[:100]]
    tok = tmp_path / "tok"
    train_bpe_tokenizer((r["question"] + "\n" + r["answer"] for r in lines), vocab_size=300).save_pretrained(tok)
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "iv.yaml"
    recipe.write_text(textwrap.dedent(f"""
        name: intervals
        output_dir: {tmp_path}/runs
        cache_dir: {tmp_path}/cache
        data_dir: {data}
        target: {{name: hf, tiny: {{arch: qwen3_moe, vocab_size: 300}}, tokenizer: {tok}, cache_dir: {tmp_path}/tiny}}
        datasets: [{{name: gsm8k, limit: 5, num_shots: 0}}]
        decoding: {{budget: 3, steps: 2, top_k: 2, max_new_tokens: 5, ignore_eos: true}}
        methods:
          - {{name: ar}}
          - {{name: sd, drafter: {{name: draft_model, share_target: true}}, selector: confidence}}
          - {{name: eco, drafter: {{name: draft_model, share_target: true}}, selector: ecospec,
             predictor: router_on_embedding}}
        eval: {{temperatures: [0.0], batch_sizes: [1], warmup: 0}}
        tracking: {{uri: "sqlite:///{tmp_path}/mlflow.db"}}
    """))
    result = run(load_recipe(recipe))
    by = {c.method: c for c in result.cells}
    from specmoe.evaluation.stats import batch_arrays

    for c in result.cells:
        assert c.prompt_batches == 5 and len(c.batches) == 5
        for name in ("tokens_per_s", "alpha", "E"):
            if name in c.metrics and not (c.autoregressive and name == "alpha"):  # AR: α = 1 by definition
                x, w = batch_arrays(c, name)
                assert x.sum() / w.sum() == pytest.approx(c.metrics[name], rel=1e-9)
        for name, (lo, hi) in c.intervals.items():
            assert lo <= c.metrics[name] <= hi, (c.label, name)
    assert {"speedup", "tokens_per_s", "alpha", "E"} <= set(by["eco"].intervals)
    assert "speedup" not in by["ar"].intervals and "tokens_per_s" in by["ar"].intervals
    saved = json.loads((result.run_dir / "eval" / "results.json").read_text())
    eco = next(r for r in saved if r["method"] == "eco")
    assert eco["intervals"]["speedup"] == by["eco"].intervals["speedup"] and eco["confidence_level"] == 0.95
    assert eco["verdict_vs_ar"] in ("faster", "slower", "not resolved")
    proc = subprocess.run(
        [sys.executable, "-m", "specmoe", "compare", "--experiment", "intervals", "--uri",
         f"sqlite:///{tmp_path}/mlflow.db", "--verdict", "eco:sd", "--verdict", "eco:ar"],
        capture_output=True, text=True, timeout=180, env=_env(),
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Table 1 — T=0 (greedy), γ=3, batch size 1 — cells: Spd / α / E — 95% intervals [lo, hi]" in out
    lo, hi = by["eco"].intervals["speedup"]
    eco_row = _rows(out, "Table 1")["eco"][0]
    assert eco_row.startswith(f"{by['eco'].metrics['speedup']:.2f}x [{lo:.2f}, {hi:.2f}] / ")
    verdict_blocks = [b for b in out.split("\n\n") if b.startswith("Verdicts")]
    assert [b.splitlines()[0] for b in verdict_blocks] == [
        "Verdicts — eco vs sd — tokens/s ratio, 95% intervals", "Verdicts — eco vs ar — tokens/s ratio, 95% intervals"]
    row = verdict_blocks[0].splitlines()[3]
    assert row.split()[:5] == ["gsm8k", "0", "3", "1", "sd@3"]
    assert any(v in row for v in ("faster", "slower", "not resolved")) and "[" in row
    ar_row = verdict_blocks[1].splitlines()[3]
    assert f"[{lo:.2f}, {hi:.2f}]" in ar_row and "ar" in ar_row.split()
    print(out)  # the tables, for a reader of -s output
    with pytest.raises(UserError, match=r"METHOD\[@γ\]:BASELINE\[@γ\]"):
        compare(f"sqlite:///{tmp_path}/mlflow.db", "intervals", verdict=["eco"])
    with pytest.raises(UserError, match="no cells of method 'nope'"):
        compare(f"sqlite:///{tmp_path}/mlflow.db", "intervals", verdict=["nope:ar"])


def test_adaptive_table_with_the_cross_fitted_best_fixed_gamma():
    """Cells with per-batch values (two datasets, 10 batches each, seeded): the adaptive table labels the
    in-sample maximum as such, adds the cross-fitted best fixed γ (the value cross_fit_best gives on the same
    batches, one choice for both datasets in the Average column) and the adaptive cells' intervals."""
    import random

    from specmoe.evaluation.stats import add_intervals, cross_fit_best

    rng = random.Random(5)
    speed = {("ar", 1): 1.0, ("eagle3", 2): 1.04, ("eagle3", 6): 1.06, ("goodput", 8): 1.08}
    cells, tps = [], {}
    for ds in ("gsm8k", "mt_bench"):
        base = [rng.uniform(50, 150) for _ in range(10)]
        group = []
        for (method, g), s in speed.items():
            vals = [b * s * rng.lognormvariate(0, 0.03) for b in base]
            tps[(method, g, ds)] = vals
            c = CellResult(method, ds, 0.0, g, 1, {"tokens_per_s": sum(vals) / 10}, autoregressive=method == "ar",
                           adaptive=method == "goodput", key=f"group-{ds}", order=len(cells), prompt_batches=10,
                           batches=[{"values": {"tokens_per_s": [v, 1.0]}} for v in vals])
            group.append(c)
        for c in group:
            c.metrics["speedup"] = c.metrics["tokens_per_s"] / group[0].metrics["tokens_per_s"]
        add_intervals(group, seed=0)
        cells += group
    text = render(build_tables(cells), "text")
    block = next(b for b in text.split("\n\n") if b.startswith("Adaptive vs best fixed γ"))
    assert block.splitlines()[0].endswith("speedup over AR — 95% intervals [lo, hi]")
    rows = {ln.split("  ")[0]: [c.strip() for c in ln.split("  ")[1:] if c.strip()] for ln in block.splitlines()[3:]}
    assert "best fixed γ (in-sample max)" in rows and "best fixed γ (cross-fitted)" in rows
    fixed = [("eagle3", 2), ("eagle3", 6)]
    want = cross_fit_best([[tps[(m, g, ds)] for m, g in fixed] for ds in ("gsm8k", "mt_bench")],
                          [tps[("ar", 1, ds)] for ds in ("gsm8k", "mt_bench")])["cross_fitted"]
    assert rows["best fixed γ (cross-fitted)"][2] == f"{want:.2f}x"
    good = next(c for c in cells if c.method == "goodput" and c.dataset == "gsm8k")
    lo, hi = good.intervals["speedup"]
    assert rows["goodput@8"][0].startswith(f"{good.metrics['speedup']:.2f}x [{lo:.2f}, {hi:.2f}] (")
    assert "best" in rows["goodput@8"][0] and "cross-fitted)" in rows["goodput@8"][0]
    records = [r for t in build_tables(cells) for r in t.records if r.get("table") == "adaptive"]
    first = next(r for r in records if r["dataset"] == "gsm8k")
    assert first["verdict_vs_best_fixed"] in ("faster", "slower", "not resolved")
    assert first["ratio_to_cross_fitted"] == pytest.approx(first["speedup"] / first["best_fixed_cross_fitted"])
    assert first["ratio_to_cross_fitted_lo"] < first["ratio_to_cross_fitted"] < first["ratio_to_cross_fitted_hi"]
    assert first["verdict_vs_cross_fitted"] in ("faster", "slower", "not resolved")


def test_old_tracking_compare_module_gives_the_moved_names_with_a_warning():
    import importlib

    from specmoe.evaluation import report_tables

    old = importlib.import_module("specmoe.tracking.compare")
    for name in report_tables.__all__:
        with pytest.warns(DeprecationWarning, match=f"specmoe.evaluation.report_tables.{name}"):
            assert getattr(old, name) is getattr(report_tables, name)
    with pytest.raises(AttributeError, match="deprecated alias"):
        old.not_a_name  # noqa: B018
