# SPDX-License-Identifier: Apache-2.0
"""``platform compare`` shows both engines: the rows ``platform bench peer`` logs (its own ``_track``, into a real
sqlite MLflow store) as a table with an ``engine`` column, after the recipe's cell tables of the experiment."""

from __future__ import annotations

import argparse
import csv
import io

import pytest

from specmoe.cli import compare as cli_compare
from specmoe.errors import UserError
from specmoe.peer import compare as pc
from specmoe.tracking import Tracker, cell_run_name, cell_tags
from specmoe_plugins.peers.vllm import bench as bench_peer


def _row(gamma, tok_s, tps, agreement, batch=1, temp=0.0, **extra):
    return {"gamma": gamma, "tok_s": tok_s, "tok_s_cpu": tok_s * 1.02, "tokens_per_step": tps, "batch": batch,
            "temperature": temp, "agreement": agreement, "agreement_own": agreement, "vs_vllm_best": None,
            "acceptance_by_position": [0.8, 0.6][: gamma - 1], "tok_s_passes": [tok_s], **extra}


ROWS = {
    "vllm/no_spec": _row(1, 300.0, 1.0, 1.0),
    "vllm/eagle3_chain2": _row(3, 330.0, 2.4, 1.0),
    "vllm/plugin": _row(3, 350.0, 2.3, 1.0, vs_best_fixed=350 / 330,
                        plugin={"budget_checked_steps": 40, "budget_violations": 0, "k_hist": {"2": 40},
                                "k_next_hist": {"2": 40}}),
    "vllm/no_spec/b4_T1": _row(1, 800.0, 1.0, None, batch=4, temp=1.0),
    "vllm/plugin/b4_T1": _row(3, 790.0, 1.0, None, batch=4, temp=1.0, vs_best_fixed=790 / 800,
                              plugin={"budget_checked_steps": 2, "budget_violations": 0, "k_hist": {"0": 60},
                                      "k_next_hist": {"0": 60}}),
    "specmoe/ar": _row(1, 250.0, 1.0, 1.0),
    "specmoe/chain3": _row(4, 290.0, 3.3, 1.0),
}


def _bench_run(uri: str) -> str:
    """One bench peer run, logged by bench peer's own tracking function."""
    r = {"target": "/t", "drafter_path": "/d", "dtype": "float32", "prompts": 8, "new_tokens": 64, "threads": 1,
         "passes": 1, "cpu": "test cpu", "torch_version": "2", "vllm": {"vllm_version": "0.32.0",
                                                                          "torch_version": "2"},
         "rows": ROWS, "agreement_reference": "vllm/no_spec"}
    args = argparse.Namespace(tracking_uri=uri, engines="vllm,specmoe", dataset="gsm8k", max_drafts=2,
                              tree_shapes="", batches="1,4", temperatures="0,1", plugin_policy=None,
                              token_table="/tt", cost_model=None)
    return bench_peer._track(r, args)


@pytest.fixture()
def store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    return uri, _bench_run(uri)


def _engine_rows(text: str) -> dict[tuple[str, str, str, str], list[str]]:
    block = next(b for b in text.split("\n\n") if b.startswith("bench peer")).splitlines()
    assert block[1].split()[:4] == ["engine", "method", "batch", "T"]
    rows = [ln.split() for ln in block[3:] if ln and not ln.startswith("agree:")]
    return {tuple(r[:4]): r[4:] for r in rows}


def test_compare_shows_both_engines_of_a_bench_peer_run(store):
    uri, run_id = store
    text = pc.compare(uri, "bench_peer")
    assert run_id[:8] in text.splitlines()[0] and "vLLM 0.32.0" in text.splitlines()[0]
    rows = _engine_rows(text)
    assert {k[0] for k in rows} == {"vllm", "specmoe"}
    assert rows[("vllm", "plugin", "1", "0")] == ["3", "350.0", "357.0", "2.300", "1.00", "1.061x", "0"]
    assert rows[("vllm", "plugin", "4", "1")][-2:] == ["0.988x", "0"]
    assert rows[("vllm", "no_spec", "4", "1")][5] == "-"  # sampled: no agreement
    assert rows[("specmoe", "chain3", "1", "0")][:4] == ["4", "290.0", "295.8", "3.300"]
    # cells sorted by temperature, then batch: greedy batch 1 first
    assert list(rows)[-1][2:] == ("4", "1")


def test_the_cli_takes_the_engine_rows_and_the_recipe_cells_of_the_experiment(store, capsys):
    uri, _ = store
    tracker = Tracker(uri, "bench_peer")
    with tracker.run("recipe") as parent:
        for method, speedup in (("ar", 1.0), ("eagle3", 1.2)):
            tags = cell_tags(method, "gsm8k", 0.0, 1 if method == "ar" else 3, 1, parent=parent.run_id)
            with tracker.run(cell_run_name(tags), tags=tags, parent_run_id=parent.run_id) as cell:
                cell.log_metrics({"speedup": speedup, "alpha": 2.0, "E": 10.0})
    p = argparse.ArgumentParser()
    cli_compare.add_parser(p.add_subparsers())
    args = p.parse_args(["compare", "--experiment", "bench_peer", "--uri", uri])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert text.startswith("Table 1") and text.index("Table 1") < text.index("bench peer")
    assert ("specmoe", "ar", "1", "0") in _engine_rows(text)
    args = p.parse_args(["compare", "--experiment", "bench_peer", "--uri", uri, "--format", "csv"])
    assert args.func(args) == 0
    blocks = capsys.readouterr().out.strip().split("\n\n")
    engines = list(csv.DictReader(io.StringIO(blocks[-1])))
    assert {r["engine"] for r in engines} == {"vllm", "specmoe"} and len(engines) == len(ROWS)
    plugin = next(r for r in engines if r["method"] == "plugin" and r["batch"] == "1")
    assert float(plugin["vs_best_fixed"]) == pytest.approx(350 / 330) and plugin["budget_violations"] == "0"


def test_an_experiment_without_bench_runs_is_the_cell_tables_as_before(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    Tracker(uri, "empty")
    with pytest.raises(UserError, match="no finished cell runs"):
        pc.compare(uri, "empty")


def test_run_id_and_all_runs_choose_the_bench_runs(store):
    uri, first = store
    second = _bench_run(uri)
    assert [r.info.run_id for r in pc.bench_runs(uri, "bench_peer")] == [second]
    assert [r.info.run_id for r in pc.bench_runs(uri, "bench_peer", all_runs=True)] == [second, first]
    assert first[:8] in pc.compare(uri, "bench_peer", run_id=first).splitlines()[0]
