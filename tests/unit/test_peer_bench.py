# SPDX-License-Identifier: Apache-2.0
"""``platform bench peer`` without vLLM: its specmoe side on a tiny predictable target with a draft that agrees
with it (fixtures/agreeing.py), and its argument checks (one clear message each, no vLLM needed)."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from fixtures.agreeing import bigram_eagle3, predictable_checkpoint

from specmoe.errors import UserError
from specmoe.registry import targets
from specmoe_plugins.peers.vllm import bench as peer


def _args(**kw) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    peer.add_arguments(p)
    argv = []
    for k, v in kw.items():
        flag = "--" + k.replace("_", "-")
        argv += [flag] if v is True else [flag, str(v)]
    return p.parse_args(argv)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("peer")
    target_dir = predictable_checkpoint("gpt_oss", root)
    draft_dir = bigram_eagle3(targets.get("hf")(path=str(target_dir)), root / "draft")
    return target_dir, draft_dir


def test_specmoe_side_rows_agreement_and_tracking(models, tmp_path, capsys):
    target_dir, draft_dir = models
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = _args(target=target_dir, drafter_path=draft_dir, engines="specmoe", random_prompts=9, prompts=2,
                 new_tokens=10, max_drafts=2, tree_shapes="tree3=3/2/2", passes=2, tracking_uri=uri,
                 json=tmp_path / "peer.json")
    assert peer.run(args) == 0
    r = json.loads((tmp_path / "peer.json").read_text())
    rows = r["rows"]
    expected = {"specmoe/ar", "specmoe/chain1/confidence", "specmoe/chain2/confidence", "specmoe/goodput@3",
                *(f"specmoe/tree3/{s}/{c}" for s in ("confidence", "ecospec") for c in ("raw", "cal"))}
    assert set(rows) == expected
    assert [rows[n]["gamma"] for n in rows] == sorted(rows[n]["gamma"] for n in rows)  # aligned by γ
    assert rows["specmoe/chain2/confidence"]["gamma"] == 3 and rows["specmoe/ar"]["tokens_per_step"] == 1.0
    for name, m in rows.items():
        assert len(m["tok_s_passes"]) == 2 and m["tok_s"] == max(m["tok_s_passes"]), name
        assert m["agreement"] == 1.0, name  # lossless: every method's greedy output is ar's
        assert m["agreement_own"] == 1.0, name
        assert m["vs_vllm_best"] is None
        assert len(m["outputs"]) == 2
    assert r["agreement_reference"] == "specmoe/ar"
    # the agreeing draft is accepted: the chain of 2 commits more than one token per step, at both positions
    chain = rows["specmoe/chain2/confidence"]
    assert chain["tokens_per_step"] > 1.5 and len(chain["acceptance_by_position"]) == 2
    assert chain["acceptance_by_position"][1] > 0
    assert "specmoe/chain2/confidence" in capsys.readouterr().out

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("bench_peer")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_id == r["mlflow_run_id"]
    assert run.data.metrics["specmoe/chain2/confidence/tokens_per_step"] == pytest.approx(chain["tokens_per_step"])
    assert run.data.params["dtype"] == "float32"


def test_agreement_counts_identical_outputs_up_to_an_eos():
    ref = [[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8], [5, 6]]
    assert peer.agreement([[1, 2, 3, 4], [1, 2, 9], [5, 6, 7, 8], [5, 6]], ref, eos={9}) == 0.75
    # a shorter output agrees only when it ends at an EOS id
    assert peer.agreement([[1, 2], [1, 2, 3, 4], [5, 6, 7, 8], [5, 6]], ref, eos={2}) == 1.0
    assert peer.agreement([[1, 2], [1, 2, 3, 4], [5, 6, 7, 8], [5, 6]], ref, eos={7}) == 0.75


def _message(args: argparse.Namespace) -> str:
    with pytest.raises(UserError) as exc:
        peer.run(args)
    return str(exc.value)


def test_old_format_draft_is_refused_with_the_rewrite_command(models, tmp_path):
    target_dir, draft_dir = models
    old = tmp_path / "old_draft"
    old.mkdir()
    cfg = json.loads((draft_dir / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 1, 1]
    (old / "config.json").write_text(json.dumps(cfg))
    msg = _message(_args(target=target_dir, drafter_path=old, engines="specmoe"))
    assert "old-format" in msg and "[0, 1, 1]" in msg
    assert f"python -m specmoe_plugins.drafters.eagle3.checkpoint {old} NEW_DIR" in msg


def test_argument_checks(models, tmp_path, monkeypatch):
    target_dir, draft_dir = models
    monkeypatch.delenv("SPECMOE_VLLM_PYTHON", raising=False)
    msg = _message(_args(target=target_dir, drafter_path=draft_dir))
    assert "docker/vllm_env.sh" in msg and "--vllm-python" in msg and "SPECMOE_VLLM_PYTHON" in msg
    msg = _message(_args(target=target_dir, drafter_path=draft_dir, vllm_python=tmp_path / "nope"))
    assert "is not an executable python" in msg
    assert "--engines" in _message(_args(target=target_dir, drafter_path=draft_dir, engines="sglang"))
    assert "--target" in _message(_args(drafter_path=draft_dir, engines="specmoe"))
    assert "has no config.json" in _message(_args(target=tmp_path, drafter_path=draft_dir, engines="specmoe"))
    assert "--drafter-path" in _message(_args(target=target_dir, engines="specmoe"))
    assert f"cannot read {tmp_path}/config.json" in _message(
        _args(target=target_dir, drafter_path=tmp_path, engines="specmoe"))
    assert "--passes must be >= 1" in _message(
        _args(target=target_dir, drafter_path=draft_dir, engines="specmoe", passes=0))
    assert "--tree-shapes 't=4/3': bench tree: --shapes entry" in _message(
        _args(target=target_dir, drafter_path=draft_dir, engines="specmoe", tree_shapes="t=4/3"))
    assert "--goodput must be a JSON object" in _message(
        _args(target=target_dir, drafter_path=draft_dir, engines="specmoe", goodput="[1]"))


def test_plugin_is_judged_against_the_cross_fitted_best_fixed_count():
    """Six fixed configurations and a plugin of the same true speed, each run timed with ±8 % noise: the
    in-sample best (the fastest pass of the fastest configuration, as the bench kept it) makes the plugin look ~3 %
    slower;
    the cross-fitted one does not (the mean over simulations within 2 % of 1); the vLLM runner's cells become
    per-(pass, batch) observations."""
    import numpy as np

    rng = np.random.default_rng(0)
    xfit, insample = [], []
    for _ in range(60):
        draw = lambda: [list(100 * rng.lognormal(0, 0.08, 8)) for _ in range(2)]  # noqa: E731  2 passes x 8
        fixed = {f"c{i}": draw() for i in range(6)}
        plugin = draw()
        r = peer.cross_fitted_vs_fixed(plugin, fixed, fixed["c0"])
        assert r is not None and r["n"] == 16 and r["lo"] < r["value"] < r["hi"]
        xfit.append(r["value"])
        fastest = lambda passes: max(np.mean(p) for p in passes)  # noqa: E731  the bench's "faster pass"
        insample.append(fastest(plugin) / max(fastest(v) for v in fixed.values()))
    assert abs(np.mean(xfit) - 1) < 0.02 and np.mean(insample) < 0.98, (np.mean(xfit), np.mean(insample))
    assert peer.cross_fitted_vs_fixed([[1.0, 2.0]], {"c0": [[1.0]]}, [[1.0, 2.0]]) is None  # batches differ
    # runner output -> rows: tokens/s per prompt batch, kept per pass
    out = {"runs": [{"num_speculative_tokens": 0, "startup_s": 1.0, "cells": [
        {"batch": 2, "temperature": 0.0, "tokens_per_s": 10.0, "tokens": 12, "outputs": [[1] * 4, [1] * 2, [1] * 6],
         "seconds": [1.0, 2.0]}]}]}
    best = {}
    for k in range(2):
        peer._keep_faster(best, peer._vllm_rows(out), k)
    assert best["vllm/no_spec/b2_T0"]["tok_s_batches_passes"] == [[6.0, 3.0], [6.0, 3.0]]


def test_the_runners_budget_check_reads_runs_of_quiet_steps():
    """The plugin logs a run of quiet steps (no draft held or proposed) as one line; the runner's budget check
    counts its steps as steps proposing nothing, and still checks every verified step against the choice."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("vllm_runner_under_test", peer.RUNNER)
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    log = [{"step": 0, "quiet_steps": 5},
           {"step": 5, "held": {"r1": 3}, "k": {"r1": 2}, "scheduled": {"r1": 2}, "k_next": 3},
           {"step": 6, "held": {"r1": 3}, "k": {"r1": 3}, "scheduled": {"r1": 3}, "k_next": 0},
           {"step": 7, "quiet_steps": 4}]

    def result(drafted):
        m = SimpleNamespace(per_step_drafted=drafted)
        return SimpleNamespace(request_id="r1", outputs=[SimpleNamespace(spec_decode_metrics=m)])

    ok = runner._budget(log, [result([2, 3])])
    assert (ok["steps"], ok["k_next_hist"], ok["k_hist"]) == (11, {"0": 10, "3": 1}, {"2": 1, "3": 1})
    assert (ok["budget_violations"], ok["budget_checked_steps"], ok["steps_capped"]) == (0, 2, 1)
    assert runner._budget(log, [result([3, 3])])["budget_violations"] == 1  # verified more than chosen


def test_rows_of_cells_without_a_batch_1_greedy_reference_are_compared():
    """``--engines vllm --batches 8 --temperatures 0``: no ``vllm/no_spec`` (batch 1, T = 0) and no specmoe AR row.
    Each greedy row is compared with its own cell's no-speculation outputs, the plugin with the cell's fixed
    configurations (a whole grid's passes once ended in a KeyError here, after the measurements)."""
    def row(outputs, tok_s, **kw):
        return {"batch": 8, "temperature": 0.0, "outputs": outputs, "tok_s": tok_s,
                "tok_s_batches_passes": [[tok_s, tok_s + 1.0]] * 2, **kw}

    same, other = [[5, 6, 7], [8, 9]], [[5, 6, 1], [8, 9]]
    best = {"vllm/no_spec/b8_T0": row(same, 100.0), "vllm/eagle3_chain4/b8_T0": row(same, 120.0),
            "vllm/plugin/b8_T0": row(other, 118.0, plugin={"budget_violations": 0})}
    assert peer.compare_rows(best, eos={2}) is None
    assert best["vllm/eagle3_chain4/b8_T0"]["agreement"] == 1.0
    assert best["vllm/plugin/b8_T0"]["agreement"] == 0.5 == best["vllm/plugin/b8_T0"]["agreement_own"]
    assert best["vllm/plugin/b8_T0"]["vs_best_fixed"] == 118.0 / 120.0
    assert best["vllm/plugin/b8_T0"]["vs_best_fixed_xfit"]["n"] == 4
    # with a batch-1 greedy reference, it is named and cells without their own no-speculation row use it
    best = {"vllm/no_spec": {**row(same, 50.0), "batch": 1}, "vllm/eagle3_chain4/b8_T0": row(other, 120.0)}
    assert peer.compare_rows(best, eos={2}) == "vllm/no_spec"
    assert best["vllm/eagle3_chain4/b8_T0"]["agreement"] == 0.5 and best["vllm/eagle3_chain4/b8_T0"][
        "agreement_own"] is None
