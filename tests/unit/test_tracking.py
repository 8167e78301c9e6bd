# SPDX-License-Identifier: Apache-2.0
"""MLflow tracking against a real sqlite store in a temporary directory."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specmoe.config.schema import TrackingConfig
from specmoe.tracking import (
    CELL_METRICS,
    CELL_TAGS,
    ERROR_ARTIFACT,
    ERROR_TAG,
    NullRun,
    NullTracker,
    Tracker,
    cell_run_name,
    cell_tags,
    env_params,
    flatten_params,
)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Tracker, Path]:
    """One sqlite store for the module (creating its schema takes seconds)."""
    workdir = tmp_path_factory.mktemp("work")
    mp = pytest.MonkeyPatch()
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    try:
        tracker = Tracker.from_config(TrackingConfig(), default_experiment="unit", workdir=workdir)
    finally:
        mp.undo()
    return tracker, workdir


def _artifacts(tracker: Tracker, run_id: str, path: str | None = None) -> set[str]:
    return {f.path for f in tracker.client.list_artifacts(run_id, path)}


def test_uri_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert (
        Tracker.resolve_uri(TrackingConfig(uri="sqlite:////x/recipe.db"), tmp_path)
        == "sqlite:////x/recipe.db"
    )
    assert Tracker.resolve_uri(TrackingConfig(), tmp_path) == "http://env:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert Tracker.resolve_uri(TrackingConfig(), tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"


def test_default_store_lives_in_workdir(store):
    tracker, workdir = store
    assert tracker.uri == f"sqlite:///{workdir.resolve()}/mlflow.db"
    assert (workdir / "mlflow.db").is_file()
    exp = tracker.client.get_experiment(tracker.experiment_id)
    assert exp.name == "unit"
    assert exp.artifact_location == (workdir / "mlartifacts").resolve().as_uri()
    # a second tracker reuses the experiment
    assert Tracker(tracker.uri, "unit").experiment_id == tracker.experiment_id


def test_flatten_params():
    flat = flatten_params(
        {
            "decoding": {"budget": 4, "stop_strings": []},
            "eval": {"temperatures": [0.0, 1.0]},
            "methods": [{"name": "ar"}, {"name": "eco", "selector": {"name": "ecospec"}}],
            "variables": {},
            "odd key!": "x" * 7000,
        }
    )
    assert flat["decoding.budget"] == "4"
    assert flat["decoding.stop_strings"] == "[]"
    assert flat["eval.temperatures"] == "[0.0, 1.0]"
    assert flat["methods.1.selector.name"] == "ecospec"
    assert flat["variables"] == "{}"
    assert len(flat["odd key_"]) == 6000


def test_parent_and_nested_runs(store, tmp_path):
    import matplotlib.figure

    tracker, _ = store
    params = {"name": "r", "decoding": {"budget": 4}, "many": {f"p{i}": i for i in range(150)}}
    with tracker.run("recipe", params=params, tags={"specmoe.kind": "recipe"}) as parent:
        tags = cell_tags("ecospec", "gsm8k", 0, 4, 1, parent=parent.run_id)
        with tracker.run(cell_run_name(tags), tags=tags, parent_run_id=parent.run_id) as cell:
            cell.log_metrics({"speedup": 1.3, "alpha": 2.5, "E": 21.0, "E_pred": None})
            cell.log_metrics({"t_verify": 0.01}, step=3)
            cell.log_dict({"a": 1}, "recipe.yaml")
            cell.log_text("hello", "texts/gen.txt")
            cell.log_table(
                [{"accepted": [2], "t_verify": 0.1}, {"accepted": [1], "t_total": 0.2}], "steps.csv"
            )
            cell.log_table([{"k": 1}], "steps.json")
            fig = matplotlib.figure.Figure()
            fig.add_subplot().plot([0, 1])
            cell.log_figure(fig, "plots/line.png")
            (tmp_path / "d").mkdir()
            (tmp_path / "d" / "x.txt").write_text("x")
            cell.log_artifact(tmp_path / "d", "dir")
            cell.log_artifact(tmp_path / "d" / "x.txt")
    p = tracker.client.get_run(parent.run_id)
    c = tracker.client.get_run(cell.run_id)
    assert p.info.status == c.info.status == "FINISHED"
    assert p.data.params["decoding.budget"] == "4" and len(p.data.params) == 152
    assert c.data.tags["mlflow.parentRunId"] == parent.run_id
    assert {k: c.data.tags[k] for k in CELL_TAGS} == tags
    assert tags["specmoe.temperature"] == "0.0" and c.info.run_name == "ecospec/gsm8k/T=0.0/g=4/bs=1"
    assert c.data.metrics == {"speedup": 1.3, "alpha": 2.5, "E": 21.0, "t_verify": 0.01}
    assert _artifacts(tracker, cell.run_id) >= {
        "recipe.yaml",
        "texts",
        "steps.csv",
        "steps.json",
        "plots",
        "dir",
        "x.txt",
    }
    assert _artifacts(tracker, cell.run_id, "plots") == {"plots/line.png"}
    csv_text = Path(tracker.client.download_artifacts(cell.run_id, "steps.csv", str(tmp_path))).read_text()
    assert csv_text.splitlines() == ["accepted,t_verify,t_total", "[2],0.1,", "[1],,0.2"]


def test_failed_run_records_the_error(store):
    tracker, _ = store
    with tracker.run("parent") as parent:
        with pytest.raises(ValueError, match="boom"):
            with tracker.run("cell", parent_run_id=parent.run_id) as cell:
                cell.log_metrics({"speedup": 2.0})
                raise ValueError("boom")
    failed = tracker.client.get_run(cell.run_id)
    assert failed.info.status == "FAILED"
    assert failed.data.tags[ERROR_TAG] == "ValueError: boom"
    assert ERROR_ARTIFACT in _artifacts(tracker, cell.run_id)
    text = tracker.client.download_artifacts(cell.run_id, ERROR_ARTIFACT)
    assert "raise ValueError" in Path(text).read_text()
    assert tracker.client.get_run(parent.run_id).info.status == "FINISHED"
    with pytest.raises(KeyboardInterrupt):
        with tracker.run("interrupted") as killed:
            raise KeyboardInterrupt
    assert tracker.client.get_run(killed.run_id).info.status == "KILLED"


def test_find_run_and_resume(store, caplog):
    tracker, _ = store
    with tracker.run("recipe-resume", params={"seed": 1}) as parent:
        done = cell_tags("ar", "humaneval", 1.0, 4, 2, parent=parent.run_id)
        with tracker.run(cell_run_name(done), tags=done, parent_run_id=parent.run_id):
            pass
        broken = cell_tags("ar", "aime25", 1.0, 4, 2, parent=parent.run_id)
        with pytest.raises(RuntimeError):
            with tracker.run(cell_run_name(broken), tags=broken, parent_run_id=parent.run_id):
                raise RuntimeError("oom")
    found = tracker.find_run(done)
    assert found is not None and found.status == "FINISHED" and found.tags["specmoe.dataset"] == "humaneval"
    assert tracker.find_run(broken) is None
    assert tracker.find_run(broken, status=None).status == "FAILED"
    assert tracker.find_run({"specmoe.method": 'it\'s "odd"'}, status=None) is None
    # reopen the parent: same run, identical params are fine, a changed one is kept and warned about
    with caplog.at_level(logging.WARNING):
        with tracker.run("recipe-resume", params={"seed": 2, "new": 3}, run_id=parent.run_id) as again:
            assert again.run_id == parent.run_id
            assert tracker.client.get_run(parent.run_id).info.status == "RUNNING"
    assert "already logged" in caplog.text
    p = tracker.client.get_run(parent.run_id)
    assert p.info.status == "FINISHED" and p.data.params == {"seed": "1", "new": "3"}


def test_runs_visible_from_another_process(store):
    tracker, _ = store
    tags = cell_tags("eagle3", "mt_bench", 0.0, 4, 1)
    with tracker.run("xproc", tags=tags) as cell:
        cell.log_metrics({"speedup": 1.25})
    code = (
        "import json, sys\nfrom mlflow import MlflowClient\n"
        "c = MlflowClient(tracking_uri=sys.argv[1])\n"
        "exp = c.get_experiment_by_name('unit')\n"
        "runs = c.search_runs([exp.experiment_id], \"tags.`specmoe.dataset` = 'mt_bench'\")\n"
        "print(json.dumps([[r.info.run_id, r.info.status, r.data.metrics] for r in runs]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, tracker.uri], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [[cell.run_id, "FINISHED", {"speedup": 1.25}]]


def test_null_tracker(tmp_path):
    tracker = Tracker.from_config(TrackingConfig(enabled=False), "x", tmp_path)
    assert isinstance(tracker, NullTracker) and not tracker.enabled
    with tracker.run("r", params={"a": 1}, tags={"b": 2}) as run:
        assert isinstance(run, NullRun) and run.run_id is None
        run.log_params({"a": 1})
        run.log_metrics({"speedup": 1.0}, step=1)
        run.set_tags({"t": 1})
        run.log_dict({}, "a.json")
        run.log_text("", "a.txt")
        run.log_table([{"a": 1}], "a.csv")
        run.log_figure(object(), "a.png")
        run.log_artifact(tmp_path, "x")
    with pytest.raises(ZeroDivisionError):
        with tracker.run("r"):
            raise ZeroDivisionError
    assert tracker.find_run({"specmoe.kind": "cell"}) is None
    assert list(tmp_path.iterdir()) == []


def test_env_params():
    env = env_params()
    for pkg in ("specmoe", "torch", "transformers", "lightning", "torchmetrics", "mlflow"):
        assert env[f"env.pkg.{pkg}"]
    assert int(env["env.hw.cpu_count"]) >= 1 and env["env.hw.cpu"]
    assert "env.hw.gpu_count" in env
    if "env.git.sha" in env:
        assert re.fullmatch(r"[0-9a-f]{40}", env["env.git.sha"])


def test_metric_and_tag_names():
    from specmoe.metrics import METRICS

    assert CELL_METRICS == tuple(METRICS)  # the cell metrics are the registry's
    assert {"speedup", "alpha", "E", "E_pass", "E_pred", "expert_bytes_per_step",
            "expert_bytes_per_step_loaded", "t_pred", "t_draft",
            "t_select", "t_verify", "t_total", "rho", "tokens_per_s", "predictor_accuracy",
            "matches_ar"} <= set(CELL_METRICS)
    assert set(cell_tags("m", "d", 0.5, 3, 8, parent="p")) == set(CELL_TAGS)


def test_plugin_params_name_the_distribution_of_each_plugin(tmp_path, monkeypatch):
    """Built-ins and third-party plugins record their distribution and version (also on Python 3.10/3.11)."""
    from fixtures.dists import fake_distribution

    from specmoe.config.schema import Component
    from specmoe.registry import selectors
    from specmoe.tracking import plugin_params

    site = fake_distribution(tmp_path / "site", "lab-sel", "2.1", "lab_sel",
                             {"specmoe.selectors": {"root_first": "lab_sel:MySelector"}})
    monkeypatch.syspath_prepend(str(site))
    selectors._clear()
    try:
        got = plugin_params([Component("root_first", {}, "selector"), Component("ecospec", {}, "selector"),
                             Component("lab_sel:MySelector", {}, "selector"), Component("hf", {}, "target"), None])
    finally:
        selectors._clear()
    from importlib.metadata import version

    assert got["plugin.selector.root_first"] == "lab-sel 2.1"
    assert got["plugin.selector.lab_sel:MySelector"] == "lab-sel 2.1"  # named by import path: its module's dist
    assert got["plugin.selector.ecospec"] == got["plugin.target.hf"] == f"specmoe {version('specmoe')}"


def test_check_uri_sqlite_and_schemes(tmp_path):
    from specmoe.errors import UserError
    from specmoe.tracking import check_uri

    check_uri(f"sqlite:///{tmp_path}/a/b/mlflow.db")  # creates the directory
    assert (tmp_path / "a" / "b").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="cannot create"):
        check_uri(f"sqlite:///{tmp_path}/file/sub/mlflow.db")
    with pytest.raises(UserError, match="unknown scheme 'htp'"):
        check_uri("htp://host:5000")
    check_uri("databricks")  # left to MLflow (credentials)
    check_uri(str(tmp_path / "mlruns"))  # a local path


def test_check_uri_tells_a_tracking_server_from_another_http_server():
    import http.server
    import threading

    from specmoe.errors import UserError
    from specmoe.tracking import check_uri

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200 if "/api/2.0/mlflow/" in self.path and self.server.mlflow else 404)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        server.mlflow = False
        with pytest.raises(UserError, match=r"answers, but not as an MLflow tracking server \(HTTP 404"):
            check_uri(uri)
        server.mlflow = True
        check_uri(uri)
    finally:
        server.shutdown()
