# SPDX-License-Identifier: Apache-2.0
"""Stage failures end in one clear message (never a traceback unless --debug), are recorded with their
reason, and a rerun continues cleanly; `platform cache ls/clean`; key facts; one process per stage."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from pathlib import Path

import pytest

from specmoe.cli.main import main
from specmoe.config.load import load_recipe
from specmoe.stages.state import list_stages, read_state


def write_recipe(tmp: Path, tracking: str = "{enabled: false}", name: str = "st") -> Path:
    from fixtures.stages import stage_recipe

    return stage_recipe(tmp, f"tracking: {tracking}\n", name, stages="first,second")


def control(tmp: Path, stage: str, **what) -> None:
    (tmp / f"{stage}.json").write_text(json.dumps(what))


def attempts(tmp: Path, stage: str) -> int:
    log = tmp / f"{stage}.log"
    return len(log.read_text().splitlines()) if log.is_file() else 0


def entry(tmp: Path, sid: str):
    return next(e for e in list_stages(tmp / "cache") if e.id == sid)


def test_failed_stage_one_message_log_state_debug_and_rerun(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    control(tmp_path, "second", fail="disk on fire")
    assert main(["run", str(recipe)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "error: stage 'second' (test_controlled) failed: RuntimeError: disk on fire" in err
    assert "next: rerun the same command" in err and "--debug" in err
    log = Path(re.search(r"log:\s+(\S+)", err).group(1))
    assert log.name == "error.log" and log.parent.parent.name == "st"  # in the run directory
    assert "Traceback" in log.read_text() and "disk on fire" in log.read_text()
    first, second = entry(tmp_path, "first"), entry(tmp_path, "second")
    assert first.state == "done" and second.state == "failed"
    assert second.reason == "RuntimeError: disk on fire"
    assert "disk on fire" in (second.path / "error.log").read_text()
    # --debug (anywhere on the line) shows the traceback too
    assert main(["run", str(recipe), "--debug"]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    # after the fix the rerun works; the finished stage is not recomputed (nothing lost)
    control(tmp_path, "second")
    assert main(["run", str(recipe)]) == 0
    assert attempts(tmp_path, "first") == 1 and attempts(tmp_path, "second") == 3
    second = entry(tmp_path, "second")
    assert second.state == "done" and read_state(second.path)["attempt"] == 3
    assert not (second.path / "error.log").exists()


def test_user_error_in_stage_and_cache_ls_clean_failed(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    control(tmp_path, "second", user_error="set 'x' in the recipe")
    assert main(["run", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "stage 'second' (test_controlled) failed: set 'x' in the recipe" in err and "Traceback" not in err
    assert main(["cache", "--cache-dir", str(tmp_path / "cache"), "ls"]) == 0
    out = capsys.readouterr().out
    header, *rows = out.splitlines()
    assert header.split() == ["ID", "NAME", "KEY", "STATE", "SIZE", "AGE"]
    states = {r.split()[0]: r.split()[3] for r in rows[:2]}
    assert states == {"first": "done", "second": "failed"}
    assert "second (" in out and "failed: set 'x' in the recipe" in out
    first_dir = entry(tmp_path, "first").path
    assert main(["cache", "--cache-dir", str(tmp_path / "cache"), "clean", "--failed"]) == 0
    assert [e.id for e in list_stages(tmp_path / "cache")] == ["first"] and first_dir.is_dir()
    assert main(["cache", "--cache-dir", str(tmp_path / "cache"), "clean", "nope"]) == 2
    assert "no cached stage matches nope" in capsys.readouterr().err
    assert main(["cache", "--cache-dir", str(tmp_path / "cache"), "clean", "first"]) == 0
    assert list_stages(tmp_path / "cache") == []


def test_incomplete_stage_is_not_done_and_rerun_continues(tmp_path, capsys):
    recipe = write_recipe(tmp_path)
    control(tmp_path, "first", incomplete="wall-clock guard stopped training at step 40 of 100")
    assert main(["run", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "stage 'first' (test_controlled) is incomplete: wall-clock guard stopped" in err
    first = entry(tmp_path, "first")
    assert first.state == "incomplete" and not (first.path / ".done").exists()
    assert attempts(tmp_path, "second") == 0  # nothing downstream ran on an incomplete stage
    control(tmp_path, "first")
    assert main(["run", str(recipe)]) == 0
    assert (first.path / "attempts.txt").read_text().split() == ["first", "first"]  # continued in place


@pytest.mark.parametrize("ckpt, resumes", [({"checkpoint": 3}, True), ({"checkpoint": 10}, False),
                                           ({"bad_checkpoint": True}, False), ({}, True)])
def test_failed_stage_resumes_only_a_valid_checkpoint_with_budget_left(tmp_path, caplog, ckpt, resumes):
    recipe = write_recipe(tmp_path)
    control(tmp_path, "first", fail="killed by the OOM killer", **ckpt)
    assert main(["run", str(recipe)]) == 1
    control(tmp_path, "first")
    with caplog.at_level(logging.WARNING):
        assert main(["run", str(recipe)]) == 0
    lines = (entry(tmp_path, "first").path / "attempts.txt").read_text().split()
    if resumes:  # budget 10 steps: a checkpoint at step 3 (or no checkpoint at all) is continued
        assert lines == ["first", "first"] and "resuming" in caplog.text
    else:  # budget used up, or no valid checkpoint: the stage restarts in an emptied directory
        assert lines == ["first"] and "restarting it cleanly" in caplog.text


def test_key_facts_are_part_of_the_stage_key(tmp_path, monkeypatch):
    from specmoe.stages.runner import StageRunner

    recipe = write_recipe(tmp_path)
    cfg = load_recipe(recipe)
    plain = StageRunner(cfg.stages, tmp_path).keys
    cfg.stages[0].component.options["fact"] = "SPECMOE_TEST_FACT"
    monkeypatch.setenv("SPECMOE_TEST_FACT", "bf16-mixed")
    bf16 = StageRunner(cfg.stages, tmp_path).keys
    monkeypatch.setenv("SPECMOE_TEST_FACT", "32-true")
    fp32 = StageRunner(cfg.stages, tmp_path).keys
    assert len({plain["first"], bf16["first"], fp32["first"]}) == 3
    assert len({plain["second"], bf16["second"], fp32["second"]}) == 3  # downstream follows


def test_one_process_computes_a_stage_the_other_waits(tmp_path, caplog):
    from specmoe.interfaces.stage import StageContext
    from specmoe.stages.runner import StageRunner

    cfg = load_recipe(write_recipe(tmp_path))
    control(tmp_path, "first", sleep=1.5)
    results: list = []

    def go():
        results.append(StageRunner(cfg.stages[:1], tmp_path / "cache").run(StageContext()))

    with caplog.at_level(logging.WARNING):
        threads = [threading.Thread(target=go) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert attempts(tmp_path, "first") == 1  # computed once
    assert sorted(r["first"]["cached"] for r in results) == [False, True]
    assert f"stage 'first' (test_controlled) is in use by pid {os.getpid()}" in caplog.text


def test_api_run_prints_nothing_and_leaves_environ_alone(tmp_path, capsys, monkeypatch):
    from specmoe.api import run

    monkeypatch.delenv("SPECMOE_DATA_DIR", raising=False)
    recipe = write_recipe(tmp_path)
    cfg = load_recipe(recipe, [f"data_dir={tmp_path}"])
    assert cfg.source == str(recipe) and cfg.overrides == [f"data_dir={tmp_path}"]
    before = dict(os.environ)
    result = run(cfg)
    assert capsys.readouterr().out == "" and dict(os.environ) == before
    assert set(result.stages) == {"first", "second"} and result.run_dir.is_dir()


def test_stage_order_follows_references_and_a_cycle_is_one_message(tmp_path):
    from specmoe.config.errors import ConfigError
    from specmoe.stages.runner import StageRunner

    cfg = load_recipe(write_recipe(tmp_path))
    first, second = cfg.stages
    assert StageRunner([second, first], tmp_path).order == ["first", "second"]  # after what it references
    first.component.options["after"] = "stage:second"
    with pytest.raises(ConfigError, match="cycle: (first -> second -> first|second -> first -> second)"):
        StageRunner(cfg.stages, tmp_path)
