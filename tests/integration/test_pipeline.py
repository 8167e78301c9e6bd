# SPDX-License-Identifier: Apache-2.0
"""`platform run` end to end on a tiny target: evaluation grid, MLflow from another process, caching, a
third-party selector plugin used from a recipe, and a run killed during evaluation then resumed."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from specmoe_plugins.targets.tiny.tokenizer import train_bpe_tokenizer

    lines = [json.loads(line) for line in (DATA / "gsm8k" / "train.jsonl").read_text().splitlines()[:300]]
    tok = train_bpe_tokenizer((r["question"] + "\n" + r["answer"] for r in lines), vocab_size=320)
    out = tmp_path_factory.mktemp("tok")
    tok.save_pretrained(out)
    return out


def recipe_text(tok: Path, work: Path, extra_methods: str = "",
                datasets: str = "[{name: gsm8k, limit: 2, num_shots: 1}]") -> str:
    return textwrap.dedent(f"""
        name: pipe
        cache_dir: {work}/cache
        output_dir: {work}/runs
        data_dir: {DATA}
        target: {{name: hf, tiny: {{arch: qwen3_moe, vocab_size: 320}}, tokenizer: {tok}, cache_dir: {work}/tiny}}
        datasets: {datasets}
        decoding: {{budget: 4, steps: 3, top_k: 2, max_new_tokens: 8}}
        methods:
          - {{name: ar}}
          - {{name: sd, drafter: {{name: draft_model, share_target: true}}, selector: confidence}}
          - {{name: eco, drafter: {{name: draft_model, share_target: true}}, selector: ecospec,
             predictor: router_on_embedding}}
        {extra_methods}
        eval: {{temperatures: [0.0, 1.0], warmup: 1}}
        tracking: {{uri: "sqlite:///{work}/mlflow.db"}}
    """)


def _fake_selector_package(tmp_path, monkeypatch):
    pkg = tmp_path / "site"
    pkg.mkdir()
    (pkg / "lab_selectors.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass
        from specmoe.decoding.selection import greedy_select
        from specmoe.interfaces.selector import Selector

        class ShallowFirst(Selector):
            '''Prefers shallow nodes, then probability.'''
            @dataclass
            class Config:
                depth_penalty: float = 1.0
            def select(self, tree, budget, experts=None, buffer=None):
                score = tree.path_logp - self.config.depth_penalty * tree.depth
                return greedy_select(tree, budget, lambda sel: score)
    """))
    monkeypatch.syspath_prepend(str(pkg))
    ep = importlib.metadata.EntryPoint("shallow_first", "lab_selectors:ShallowFirst", "specmoe.selectors")
    real = importlib.metadata.entry_points

    def fake(**kw):
        if kw.get("group") == "specmoe.selectors":
            return list(real(**kw)) + [ep]
        return real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    from specmoe.registry import selectors

    selectors._clear()
    return selectors


def test_run_compare_cache_and_third_party_selector(tmp_path, tokenizer_dir, monkeypatch):
    from specmoe.api import run_recipe

    selectors = _fake_selector_package(tmp_path, monkeypatch)
    try:
        extra = ("  - {name: lab, drafter: {name: draft_model, share_target: true}, "
                 "selector: {name: shallow_first, depth_penalty: 0.5}}")
        recipe = tmp_path / "pipe.yaml"
        recipe.write_text(recipe_text(tokenizer_dir, tmp_path, extra))
        monkeypatch.chdir(tmp_path)
        res = run_recipe(recipe)
        assert len(res.cells) == 2 * 4  # 2 temperatures x (ar + 3 methods)
        for c in res.cells:
            if c.temperature == 0 and not c.autoregressive:
                assert c.metrics["matches_ar"] == 1.0, c.label  # lossless at T = 0
        assert "eco" in res.table and "lab" in res.table
        assert (res.run_dir / "config.yaml").is_file() and (res.run_dir / "eval" / "table.md").is_file()
        assert any(p.name.startswith("fig1a") for p in (res.run_dir / "eval" / "plots").iterdir())
        # one table per setting (AR joins it: no table of its own), built once and logged once
        assert res.table.count("Table 1 —") == 2 and "γ=1" not in res.table
        import mlflow

        client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
        assert {f.path for f in client.list_artifacts(res.run_id, "comparison")} == {
            "comparison/tables.md", "comparison/tables.csv"}
        (tmp_path / "dl").mkdir()
        logged = Path(client.download_artifacts(res.run_id, "comparison/tables.md", str(tmp_path / "dl")))
        assert logged.read_text() == (res.run_dir / "eval" / "table.md").read_text()
        params = client.get_run(res.run_id).data.params
        assert params["plugin.selector.ecospec"].startswith("specmoe ") and "plugin.selector.shallow_first" in params
        # another process reads the runs through MLflow
        out = subprocess.run([sys.executable, "-m", "specmoe", "compare", "--experiment", "pipe", "--uri",
                              f"sqlite:///{tmp_path}/mlflow.db"], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert "eco" in out.stdout and "gsm8k" in out.stdout
        # rerun: every cell comes from the cache
        res2 = run_recipe(recipe)
        assert all(c.cached for c in res2.cells)
    finally:
        selectors._clear()


def test_killed_during_evaluation_resumes(tmp_path, tokenizer_dir):
    recipe = tmp_path / "pipe.yaml"
    recipe.write_text(recipe_text(tokenizer_dir, tmp_path,
                                  datasets="[{name: gsm8k, limit: 3, num_shots: 1}, {name: math500, limit: 3}]"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "specmoe", "run", str(recipe)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cells = tmp_path / "cache" / "eval"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:  # one group finished, the next one started
        if len(list(cells.glob("*/cells.json"))) >= 1 and list(cells.glob("*/batch-*.json")):
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {p.parent.name for p in cells.glob("*/cells.json")}
    batches_before = {p.parent.name: p.read_text() for p in cells.glob("*/batch-*.json")}
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    done_after = {p.parent.name for p in cells.glob("*/cells.json")}
    assert done_before < done_after and len(done_after) == 2 * 2  # temperatures x datasets
    if batches_before:  # the group in flight kept its finished prompt batches and continued after them
        assert "already measured; continuing" in out.stderr
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("pipe")
    parents = client.search_runs([exp.experiment_id], "tags.`specmoe.kind` = 'recipe'")
    assert len(parents) == 1, "the killed run is resumed, not duplicated"
    cell_runs = client.search_runs([exp.experiment_id], "tags.`specmoe.kind` = 'cell'")
    keys = [tuple(r.data.tags[k] for k in ("specmoe.method", "specmoe.dataset", "specmoe.temperature"))
            for r in cell_runs if r.info.status == "FINISHED"]
    assert len(keys) == len(set(keys)) == 12
    assert "gsm8k" in out.stdout and "math500" in out.stdout
