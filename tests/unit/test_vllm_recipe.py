# SPDX-License-Identifier: Apache-2.0
"""The GPU twin of the vLLM plugin's measurement, ``recipes/gptoss120b_vllm.yaml``: it validates as a run
validates it (``load_recipe``: the ``vllm_peer`` stage comes from its entry point, every option is checked against
the stage's config, ``stage:`` references resolve), stops at once without its GPUs, and the stage's own checks
and summary behave (no GPU, no vLLM needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from specmoe.config.errors import ConfigError
from specmoe.config.load import load_recipe
from specmoe.errors import UserError

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "gptoss120b_vllm.yaml"


def _stage(cfg, sid):
    return next(s for s in cfg.stages if s.id == sid)


def test_the_recipe_validates_with_the_plugin_fixed_counts_and_adaptive_verification():
    cfg = load_recipe(RECIPE)
    assert [s.id for s in cfg.stages] == ["traces", "token_table", "vllm"]
    assert cfg.requires.cuda_devices == 8
    vllm = _stage(cfg, "vllm").component
    o = vllm.options
    assert vllm.name == "vllm_peer"
    assert o["target"] == "openai/gpt-oss-120b" and o["draft"] == "lmsys/EAGLE3-gpt-oss-120b-bf16"
    assert o["max_drafts"] == 5 and o["variants"] == ["plugin", "plugin_tokens"] and o["adaptive"] is True
    assert o["token_table"] == "stage:token_table" and o["dataset"].name == "gsm8k"
    assert o["engine_args"]["tensor_parallel_size"] == 8 and o["temperatures"] == [0.0, 1.0]
    # variables reach the stage as a run's overrides would
    o2 = _stage(load_recipe(RECIPE, ["variables.tp=4", "variables.vllm_draft=/ckpt/eagle3"]), "vllm").component.options
    assert o2["engine_args"]["tensor_parallel_size"] == 4 and o2["draft"] == "/ckpt/eagle3"


def test_a_wrong_option_of_the_stage_is_named():
    with pytest.raises(ConfigError) as err:
        load_recipe(RECIPE, ["stages.2.max_draft=4"])
    assert "stages.2.max_draft" in err.value.report()


def test_the_recipe_stops_at_once_without_its_gpus(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = subprocess.run([sys.executable, "-m", "specmoe", "run", str(RECIPE), f"output_dir={tmp_path}/runs",
                          f"cache_dir={tmp_path}/cache"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "needs 8 CUDA GPU(s); this machine has 0" in out.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_the_stage_names_a_missing_vllm_environment(monkeypatch):
    from specmoe_plugins.peers.vllm.stage import VllmPeer

    monkeypatch.delenv("SPECMOE_VLLM_PYTHON", raising=False)
    stage = VllmPeer.__new__(VllmPeer)
    stage.config = SimpleNamespace(vllm_python="", target="t", draft="d", variants=["plugin"], token_table=None,
                                   max_drafts=5, batches=[1], new_tokens=8)
    with pytest.raises(UserError, match="SPECMOE_VLLM_PYTHON"):
        stage._check()
    stage.config.vllm_python = sys.executable
    with pytest.raises(UserError, match="vllm_peer.token_table"):
        stage._check()
    stage.config.variants = ["plugin", "bogus"]
    with pytest.raises(UserError, match="'bogus'"):
        stage._check()


def test_the_summary_ranks_every_configuration_against_the_best_fixed_one():
    from specmoe_plugins.peers.vllm.stage import summarise

    def cell(tok_s, outputs, batch=1, temp=0.0, **kw):
        return {"batch": batch, "temperature": temp, "tokens_per_s": tok_s, "outputs": outputs, **kw}

    ref = [[1, 2], [3, 4]]
    passes = {
        "fixed": {"runs": [{"name": "no_spec", "cells": [cell(100.0, ref), cell(400.0, ref, batch=8)]},
                           {"name": "eagle3_chain2", "cells": [cell(150.0, ref, tokens_per_step=2.5),
                                                               cell(300.0, ref, batch=8)]}]},
        "plugin": {"runs": [{"name": "plugin", "cells": [
            cell(160.0, ref, plugin={"budget_violations": 0}),
            cell(396.0, [[1, 2], [3, 5]], batch=8, plugin={"budget_violations": 0})]}]},
        "adaptive": {"error": "ValueError: needs the V2 model runner", "runs": []},
    }
    s = summarise(passes)
    b1, b8 = s["cells"]["b1_T0"], s["cells"]["b8_T0"]
    assert b1["best_fixed"] == "eagle3_chain2" and b8["best_fixed"] == "no_spec"
    assert b1["rows"]["plugin"]["vs_best_fixed"] == pytest.approx(160 / 150)
    assert b8["rows"]["plugin"]["vs_best_fixed"] == pytest.approx(0.99)
    assert b8["rows"]["plugin"]["agreement"] == 0.5 and b1["rows"]["plugin"]["budget_violations"] == 0
    assert s["errors"] == {"adaptive": "ValueError: needs the V2 model runner"}
