# SPDX-License-Identifier: Apache-2.0
"""specmoe's vLLM plugin (``plugins/specmoe_vllm``) in the real vLLM (its own environment, by subprocess).

A tiny predictable GPT-OSS target and the EAGLE-3 draft built from its weights (``bigram_eagle3``), as
``test_peer_bench_vllm.py`` builds them; a token-to-experts table in the ``build_token_table`` stage's file
format and a specmoe ``cost_model.json``, both turned into the plugin's policy file by ``platform peer
export-policy`` (the exporter under test too). vLLM runs through ``specmoe_plugins/peers/vllm/vllm_runner.py`` (a
script with a ``__main__`` guard run by vLLM's python): no speculation, and EAGLE-3 with up to :data:`K` drafts
under ``SpecMoEScheduler`` with the expert term (``plugin``) and without (``plugin_tokens``), both skipping the
drafter on steps that propose nothing (``specmoe_vllm.drafter``, the default), and with the expert term in vLLM's
own way (``plugin_noskip``: every step pays the drafter's pass), at batch 1, 4 and 8 greedy, and batch 4 at T = 1,
every engine started in one process and measured in turn (the runner's ``interleave``).
Checked: greedy outputs with the plugin equal vLLM's without speculation, every prompt, every batch size; the budget
(greedy and T = 1): per request, the drafts vLLM verified at each step (its own ``per_request_spec_decode_metrics:
detailed`` counts) are exactly the policy's non-zero choices in order (so never more); and the cap is exercised (the
cost file makes the policy verify fewer than K drafts in some steps and propose fewer in others); the drafter is
skipped on steps that propose nothing and the held rows are replayed, none dropped. The policy's online cost refit
is off here (``online: false``) so that its choices do not depend on the machine's timing. Skipped without
``SPECMOE_VLLM_PYTHON`` (``bash docker/vllm_env.sh`` prints it).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest
import torch
from fixtures.agreeing import VLLM_HEADS, bigram_eagle3, predictable_checkpoint
from fixtures.tiny import random_prompts

from specmoe.registry import targets

VLLM_PYTHON = os.environ.get("SPECMOE_VLLM_PYTHON", "")
ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "plugins" / "specmoe_plugins" / "peers" / "vllm" / "vllm_runner.py"

pytestmark = [pytest.mark.vllm]
if not VLLM_PYTHON:
    pytestmark.append(pytest.mark.skip(reason="SPECMOE_VLLM_PYTHON is not set: point it at the python of vLLM's "
                                              "environment (bash docker/vllm_env.sh prints it)"))

K = 3
MAX_NEW = 16
N_PROMPTS = 8
BATCHES = (1, 4, 8)


def _token_table(out: Path, cfg: dict, seed: int = 0) -> Path:
    """A table in build_token_table's files: each token its own random top-k per layer (seeded)."""
    from safetensors.torch import save_file

    rnd = random.Random(seed)
    L, E, k, V = cfg["num_hidden_layers"], cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["vocab_size"]
    ids = list(range(0, V, 2))  # half the vocabulary has an entry; the rest takes the fallback
    experts = torch.tensor([[rnd.sample(range(E), k) for _ in range(L)] for _ in ids], dtype=torch.int16)
    out.mkdir(parents=True)
    (out / "token_table.json").write_text(json.dumps({"num_layers": L, "num_experts": E, "top_k": k,
                                                      "vocab_size": V}))
    save_file({"token_ids": torch.tensor(ids), "experts": experts,
               "fallback": torch.tensor([list(range(k))] * L, dtype=torch.int16),
               "token_counts": torch.ones(len(ids), dtype=torch.int64)}, str(out / "token_table.safetensors"))
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Build the checkpoints and the policy, run vLLM once over every config and batch size: the runner's JSON."""
    import argparse

    from specmoe_plugins.peers.vllm import export

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("vllm_plugin")
    target_dir = predictable_checkpoint("gpt_oss", root, out=root / "target", **VLLM_HEADS)
    target = targets.get("hf")(path=str(target_dir))
    draft = bigram_eagle3(target, root / "draft")
    cfg = json.loads((target_dir / "config.json").read_text())
    table = _token_table(root / "token_table", cfg)
    # a pass costs 1 ms + 0.15 ms per verified token + 0.03 ms per expert-layer, a draft step 0.2 ms: at batch 8
    # drafts pay less than at batch 1, so the choices move between 0 and K
    (root / "cost_model.json").write_text(json.dumps({
        "format": "specmoe.cost_model/1", "features": ["fixed", "tokens", "expert_layers", "kv_slots"],
        "coef": {"fixed": 1e-3, "tokens": 1.5e-4, "expert_layers": 3e-5, "kv_slots": 0.0}, "meta": {}}))
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    export.add_parser(sub)
    args = p.parse_args(["peer", "export-policy", "--token-table", str(table), "--cost-model",
                         str(root / "cost_model.json"), "--acceptance", "0.9,0.8,0.7", "--max-drafts", str(K),
                         "--out", str(root / "policy.json")])
    assert args.func(args) == 0
    policy = json.loads((root / "policy.json").read_text())
    policy["cost"]["draft_steps"] = 2e-4
    (root / "policy.json").write_text(json.dumps(policy))

    prompts = random_prompts(N_PROMPTS, [5, 9, 13], target.vocab_size, seed=4)
    plugin = {"policy": str(root / "policy.json"), "online": False}
    req = {"target": str(root / "target"), "draft": str(draft), "prompts": prompts, "max_new_tokens": MAX_NEW,
           "configs": [0, {"name": "plugin", "num_speculative_tokens": K, "plugin": plugin},
                       {"name": "plugin_tokens", "num_speculative_tokens": K,
                        "plugin": {**plugin, "expert_cost": False}},
                       {"name": "plugin_noskip", "num_speculative_tokens": K,
                        "plugin": {**plugin, "skip_drafter": False}}],
           "cells": [{"batch": b, "temperature": 0.0} for b in BATCHES] + [{"batch": 4, "temperature": 1.0}],
           "dtype": "float32", "warmup": 1,
           "ignore_eos": True, "interleave": True}  # every engine in one process, measured in turn
    (root / "request.json").write_text(json.dumps(req))
    py = Path(VLLM_PYTHON)
    assert py.is_file(), f"SPECMOE_VLLM_PYTHON={VLLM_PYTHON} does not exist: run bash docker/vllm_env.sh"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(py), str(RUNNER), str(root / "request.json"), str(root / "out.json")],
                          capture_output=True, text=True, env=env, timeout=600, cwd=str(root))
    assert proc.returncode == 0, f"vLLM runner failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    out = json.loads((root / "out.json").read_text())
    return {r["name"]: r for r in out["runs"]}, root


def test_plugin_is_a_vllm_general_plugin():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import importlib.metadata as m; print([e.value for e in m.entry_points(group='vllm.general_plugins') "
            "if e.name == 'specmoe'])")
    proc = subprocess.run([VLLM_PYTHON, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "specmoe_vllm:register" in proc.stdout


@pytest.mark.parametrize("name", ["plugin", "plugin_tokens", "plugin_noskip"])
def test_greedy_output_equals_vllm_without_speculation(served, name):
    runs, _ = served
    ref = {c["batch"]: c["outputs"] for c in runs["no_spec"]["cells"] if c["temperature"] == 0}
    cells = {c["batch"]: c for c in runs[name]["cells"] if c["temperature"] == 0}
    assert sorted(cells) == list(BATCHES)
    for b in BATCHES:
        assert len(ref[b]) == N_PROMPTS and all(len(o) == MAX_NEW for o in ref[b])
        assert cells[b]["outputs"] == ref[b], f"{name} at batch {b}"
    assert cells[1]["drafts"] > 0  # it did speculate (at batch 8 this cost file makes drafts not pay)


@pytest.mark.parametrize("name", ["plugin", "plugin_tokens", "plugin_noskip"])
def test_budget_respected_per_request(served, name):
    runs, _ = served
    checked = 0
    for c in runs[name]["cells"]:  # greedy and T = 1
        pl = c["plugin"]
        det = pl["per_request"]
        assert len(det["drafted"]) == N_PROMPTS
        for drafted, chosen in zip(det["drafted"], det["chosen"]):
            assert drafted == chosen, (c["batch"], drafted, chosen)  # vLLM verified exactly what was chosen
            assert all(1 <= d <= K for d in drafted)
        assert pl["budget_violations"] == 0 and pl["budget_checked_steps"] == sum(map(len, det["drafted"]))
        checked += pl["budget_checked_steps"]
        # vLLM's own counter agrees: the drafts it verified are the sum of the choices
        assert c["draft_tokens"] == sum(map(sum, det["chosen"]))
    assert checked > 0


def test_the_cap_is_exercised(served):
    """The policy file makes the choices move: some steps verify fewer drafts than K, and larger batches verify
    fewer drafts per request than batch 1 (with the expert term)."""
    runs, _ = served
    cells = {c["batch"]: c for c in runs["plugin"]["cells"] if c["temperature"] == 0}
    ks = {b: {int(k): n for k, n in c["plugin"]["k_hist"].items()} for b, c in cells.items()}
    nexts = {b: {int(k): n for k, n in c["plugin"]["k_next_hist"].items()} for b, c in cells.items()}
    assert any(k < K for b in BATCHES for k in list(ks[b]) + list(nexts[b])), (ks, nexts)

    def mean(h):
        return sum(k * n for k, n in h.items()) / max(sum(h.values()), 1)

    assert mean(nexts[8]) < mean(nexts[1]), nexts


def test_steps_that_propose_nothing_skip_the_drafter(served):
    """The proposer of ``specmoe_vllm.drafter`` is vLLM's (put in place by the plugin's entry point); with the
    plugin's default it skips the drafter on steps that propose nothing (where drafts do not pay: the token-only
    variant at batch 4 and 8, the expert-aware one at T = 1), samples them without the rejection sampler and
    replays the held rows when drafting resumes, dropping none (and holds nothing on floor steps no probe would
    read, :meth:`GoodputPolicy.holds`); with ``skip_drafter: false`` every step runs the
    drafter as vLLM does. The outputs of both equal vLLM's without speculation (test above), so greedy cells with
    skipped steps are required here."""
    runs, _ = served
    by = {name: {(c["batch"], c["temperature"]): c["plugin"]["drafter"] for c in runs[name]["cells"]}
          for name in ("plugin", "plugin_tokens", "plugin_noskip")}
    skipped = [cell for n in ("plugin", "plugin_tokens") for cell, d in by[n].items()
               if d["skipped_steps"] > 0 and d["plain_steps"] > 0]
    assert any(t == 0.0 and b > 1 for b, t in skipped), by
    assert sum(d["catch_up_rows"] for n in ("plugin", "plugin_tokens") for d in by[n].values()) > 0
    assert all(d["dropped_rows"] == 0 for n in ("plugin", "plugin_tokens") for d in by[n].values())
    # once the probes' back-off outlasts the requests (16 tokens each), floor steps hold nothing and run as vLLM
    # runs without speculation (drafter._wrap_plain_steps, the only place that counts unheld_steps)
    assert sum(d["unheld_steps"] for n in ("plugin", "plugin_tokens") for d in by[n].values()) > 0
    # and each of them runs the target's forward without EAGLE-3's auxiliary hidden-state capture (switched off
    # and back on around the step, the only place that counts aux_off_steps): among them greedy cells, whose
    # outputs the test above compares with vLLM's without speculation
    assert all(d["aux_off_steps"] == d["unheld_steps"] for n in ("plugin", "plugin_tokens") for d in by[n].values())
    assert any(d["aux_off_steps"] > 0 for n in ("plugin", "plugin_tokens") for (b, t), d in by[n].items() if t == 0)
    # and the scheduler leaves most of those unpriced (the same choice, the policy's counting kept: the budget
    # test above checks every verifying step against the policy's log)
    assert sum(d["unpriced_steps"] for n in ("plugin", "plugin_tokens") for d in by[n].values()) > 0
    # without skip_drafter the drafter's own counters stay at zero; the scheduler's unpriced floor steps are not the
    # drafter's and may come there too (floor steps whose requests hold no drafts: none on a Zen 4 here, some on
    # CI's machine, which the policy's path allows with the drafter on or off)
    assert all(v == 0 for d in by["plugin_noskip"].values() for k, v in d.items() if k != "unpriced_steps"), \
        by["plugin_noskip"]


def test_a_bad_policy_file_is_one_message(served, tmp_path):
    runs, root = served
    req = json.loads((root / "request.json").read_text())
    req["configs"] = [{"name": "plugin", "num_speculative_tokens": K,
                       "plugin": {"policy": str(tmp_path / "missing.json")}}]
    (tmp_path / "request.json").write_text(json.dumps(req))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([VLLM_PYTHON, str(RUNNER), str(tmp_path / "request.json"), str(tmp_path / "out.json")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2
    assert "missing.json does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_peer_rows_for_the_plugin(served, tmp_path):
    """``platform bench peer --engines vllm --token-table ... --batches 1,4``: the policy exported per pass
    (cost refitted on the fixed runs before it), the plugin's rows next to the fixed draft counts in every cell
    (one variant and one draft here, to keep the test short)."""
    import argparse

    from specmoe_plugins.peers.vllm import bench as peer

    _, root = served
    p = argparse.ArgumentParser()
    peer.add_arguments(p)
    args = p.parse_args([
        "--target", str(root / "target"), "--drafter-path", str(root / "draft"), "--engines", "vllm",
        "--random-prompts", "8", "--prompts", "4", "--new-tokens", "12", "--max-drafts", "1",
        "--plugin-variants", "plugin", "--passes", "1", "--batches", "1,4", "--token-table", str(root / "token_table"),
        "--cost-model", str(root / "cost_model.json"), "--vllm-python", VLLM_PYTHON, "--no-tracking",
        "--json", str(tmp_path / "peer.json"), "--keep-dir", str(tmp_path / "keep")])
    assert peer.run(args) == 0
    # interleaved (the default): pass 0's policy is refitted on a calibration run of the fixed counts, then every
    # configuration (fixed and plugin) runs in one process
    keep = tmp_path / "keep"
    assert json.loads((keep / "policy_0.json").read_text())["meta"]["sources"]["vllm_run"] == str(
        keep / "vllm_out_calibration.json")
    req = json.loads((keep / "vllm_request_0.json").read_text())
    assert req["interleave"] and [c if isinstance(c, int) else c["name"] for c in req["configs"]] == [0, 1, "plugin"]
    rows = json.loads((tmp_path / "peer.json").read_text())["rows"]
    for sfx in ("", "/b4_T0"):
        m = rows[f"vllm/plugin{sfx}"]
        assert m["agreement"] == 1.0 and m["plugin"]["budget_violations"] == 0, sfx
        assert m["vs_best_fixed"] > 0 and m["gamma"] == 2
        assert {f"vllm/no_spec{sfx}", f"vllm/eagle3_chain1{sfx}"} <= set(rows)
    assert not any("plugin_tokens" in n for n in rows)
