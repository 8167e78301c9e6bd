# SPDX-License-Identifier: Apache-2.0
"""Faults a new user runs into (issue: one clear message each, and nothing finished is lost): damaged target
files, a damaged checkpoint, two runs at once on a fresh store, an unreachable or unknown tracking URI, a
resumed run's stale error records, partial nested overrides, a third-party plugin reusing a built-in name."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from specmoe.cli.main import main
from specmoe.config.errors import ConfigError
from specmoe.config.load import load_recipe
from specmoe.errors import UserError
from specmoe.stages.state import list_stages

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def _recipe(tmp: Path, body: str, name: str = "faults") -> Path:
    from fixtures.stages import stage_recipe

    return stage_recipe(tmp, f"data_dir: {DATA}\n" + textwrap.dedent(body), name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ damaged target files
@pytest.mark.parametrize("damage", ["weights", "config"])
def test_damaged_target_files_are_named(make_target, tmp_path, capsys, damage):
    src = Path(make_target("qwen3_moe").path)
    broken = tmp_path / "target"
    shutil.copytree(src, broken)
    if damage == "weights":
        f = broken / "model.safetensors"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # killed while copying
    else:
        f = broken / "config.json"
        f.write_text(f.read_text()[:40])
    size = f.stat().st_size
    recipe = _recipe(tmp_path, f"""
        target: {{name: hf, path: {broken}}}
        datasets: [{{name: gsm8k, limit: 1}}]
        methods: [{{name: ar}}]
        tracking: {{enabled: false}}
    """)
    assert main(["run", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 1
    assert str(f) in err and ("truncated" in err if damage == "weights" else "not a valid JSON" in err)
    assert "platform cache clean" in err
    assert f.stat().st_size == size  # the file is left as it was
    assert [(e.id, e.state) for e in list_stages(tmp_path / "cache")] == [("first", "done")]  # kept


# ------------------------------------------------------------------ damaged checkpoints
def _ckpt(path: Path, step: int, full: bool = True) -> None:
    import torch

    state = {"state_dict": {"w": torch.ones(3)}, "global_step": step}
    if full:
        state["optimizer_states"] = [{}]
    torch.save(state, path)


def test_damaged_last_checkpoint_falls_back_and_is_kept(tmp_path, caplog):
    from specmoe.training.checkpoints import has_budget_left, resume_checkpoint

    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    _ckpt(ckpts / "step-000002.ckpt", 2)
    time.sleep(0.01)
    _ckpt(ckpts / "final.ckpt", 4, full=False)  # weights only: nothing to resume from
    _ckpt(ckpts / "last.ckpt", 4)
    whole = (ckpts / "last.ckpt").read_bytes()
    (ckpts / "last.ckpt").write_bytes(whole[: len(whole) // 2])  # killed / disk full while saving
    with caplog.at_level(logging.WARNING):
        chosen = resume_checkpoint(ckpts / "last.ckpt")
    assert chosen == str(ckpts / "step-000002.ckpt")
    assert "damaged checkpoint" in caplog.text and "last.ckpt" in caplog.text and "resuming from" in caplog.text
    assert (ckpts / "last.ckpt.damaged").read_bytes() == whole[: len(whole) // 2]  # kept, renamed
    assert has_budget_left(tmp_path, {"max_steps": 3}) and not has_budget_left(tmp_path, {"max_steps": 2})
    (ckpts / "step-000002.ckpt").write_bytes(b"")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert resume_checkpoint(ckpts) is None
    assert "starts again from step 0" in caplog.text
    assert resume_checkpoint(tmp_path / "nothing" / "last.ckpt") is None


# ------------------------------------------------------------------ two runs at once on a fresh store
def test_two_processes_create_one_fresh_sqlite_store(tmp_path):
    code = textwrap.dedent(f"""
        import sys, time
        import mlflow
        from specmoe.tracking import Tracker
        time.sleep(max(0.0, float(sys.argv[1]) - time.time()))
        t = Tracker("sqlite:///{tmp_path}/mlflow.db", "race")
        with t.run("r") as run:
            run.log_metrics({{"x": 1.0}})
        print("OK", t.experiment_id)
    """)
    start = str(time.time() + 6)  # both processes touch the new store at the same moment
    procs = [subprocess.Popen([sys.executable, "-c", code, start], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    for (_out, err), p in zip(outs, procs):
        assert p.returncode == 0, err[-2000:]
    ids = {out.split()[-1] for out, _ in outs}
    assert len(ids) == 1  # one experiment, created once


# ------------------------------------------------------------------ tracking URIs
def test_unreachable_tracking_uri_fails_in_seconds_before_any_work(tmp_path, capsys):
    from specmoe.tracking.uri import check_uri

    uri = f"http://127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    with pytest.raises(UserError, match="not reachable.*tracking.enabled=false"):
        check_uri(uri)
    assert time.monotonic() - t0 < 10
    recipe = _recipe(tmp_path, f"tracking: {{uri: '{uri}'}}\n")
    assert main(["run", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert f"tracking URI '{uri}' is not reachable" in err and "Traceback" not in err
    assert not (tmp_path / "first.log").exists() and not (tmp_path / "runs").exists()  # nothing started
    assert main(["run", str(recipe), "tracking.enabled=false"]) == 0  # the way out the message gives


def test_unknown_tracking_uri_scheme(tmp_path, capsys):
    recipe = _recipe(tmp_path, "tracking: {uri: 'mlfow://typo:5000'}\n")
    assert main(["run", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "unknown scheme 'mlfow'" in err and "http:" in err and "Traceback" not in err


# ------------------------------------------------------------------ resumed run clears stale records
def test_resumed_run_that_finishes_clears_error_and_kills_stale_children(tmp_path, monkeypatch):
    import mlflow

    from specmoe.tracking import ERROR_ARTIFACT, ERROR_TAG

    monkeypatch.chdir(tmp_path)
    recipe = _recipe(tmp_path, f"tracking: {{uri: 'sqlite:///{tmp_path}/mlflow.db'}}\n")
    (tmp_path / "first.json").write_text(json.dumps({"fail": "interrupted"}))
    assert main(["run", str(recipe)]) == 1
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("faults")
    (parent,) = client.search_runs([exp.experiment_id], "tags.`specmoe.kind` = 'recipe'")
    assert parent.info.status == "FAILED" and "interrupted" in parent.data.tags[ERROR_TAG]
    assert ERROR_ARTIFACT in {f.path for f in client.list_artifacts(parent.info.run_id)}
    # a training logger of the attempt, left RUNNING when its process was killed
    stale = client.create_run(exp.experiment_id, tags={"mlflow.parentRunId": parent.info.run_id}).info.run_id
    (tmp_path / "first.json").write_text("{}")
    assert main(["run", str(recipe)]) == 0
    again = client.get_run(parent.info.run_id)
    assert again.info.status == "FINISHED" and ERROR_TAG not in again.data.tags
    assert ERROR_ARTIFACT not in {f.path for f in client.list_artifacts(parent.info.run_id)}
    assert client.get_run(stale).info.status == "KILLED"
    assert len(client.search_runs([exp.experiment_id], "tags.`specmoe.kind` = 'recipe'")) == 1


# ------------------------------------------------------------------ partial nested overrides
def test_partial_trainer_override_keeps_the_stage_defaults(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(textwrap.dedent("""
        name: t
        stages:
          - {id: target, name: pretrain_target, trainer: {max_steps: 5}}
    """))
    cfg = load_recipe(recipe)
    trainer = cfg.stages[0].component.options["trainer"]
    assert trainer.max_steps == 5
    from specmoe_plugins.targets.tiny.stage import PretrainTarget

    default = PretrainTarget.Config().trainer
    for name in ("check_val_every_n_epoch", "val_check_interval", "max_epochs", "gradient_clip_val"):
        assert getattr(trainer, name) == getattr(default, name), name  # the stage's own defaults, kept
    with pytest.raises(ConfigError) as err:
        load_recipe(recipe, ["stages.0.trainer.max_steps=many"])
    (problem,) = err.value.problems
    assert problem.key == "stages.0.trainer.max_steps" and "command-line override" in problem.file


# ------------------------------------------------------------------ a third-party plugin reuses a built-in name
def test_third_party_duplicate_of_a_builtin_name(tmp_path, monkeypatch, capsys, caplog):
    from fixtures.dists import fake_distribution

    from specmoe.registry import DuplicatePluginError, selectors

    site = fake_distribution(tmp_path / "site", "lab-dup", "0.3", "lab_dup", {
        "specmoe.selectors": {"ecospec": "lab_dup:MySelector", "lab_root": "lab_dup:MySelector"}})
    monkeypatch.syspath_prepend(str(site))
    selectors._clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert main(["ls", "selector"]) == 0
            out = capsys.readouterr().out
            assert "lab_dup:MySelector" in out and "EcoSpecSelector" in out and "CONFLICT" in out
            assert selectors.get("global_cost").__name__ == "GlobalCostSelector"  # the others work
            assert selectors.get("lab_root").__name__ == "MySelector"
        warnings = [r.getMessage() for r in caplog.records if "declared by more than one" in r.getMessage()]
        assert len(warnings) == 1  # reported once
        assert "'specmoe'" in warnings[0] and "'lab-dup'" in warnings[0]
        with pytest.raises(DuplicatePluginError, match="lab_dup:MySelector"):
            selectors.get("ecospec")
        assert selectors.get("lab_dup:MySelector").__name__ == "MySelector"  # named directly: usable
        assert selectors.distribution("lab_root") == ("lab-dup", "0.3")
    finally:
        selectors._clear()
