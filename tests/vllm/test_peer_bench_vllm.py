# SPDX-License-Identifier: Apache-2.0
"""``platform bench peer`` end to end with the real vLLM (its own environment, ``SPECMOE_VLLM_PYTHON``).

A tiny predictable GPT-OSS target (fixtures/agreeing.py's embedding scaling, with a head size vLLM's CPU
attention supports) and the EAGLE-3 draft built from its own weights (``bigram_eagle3``, exported with
``save_eagle3``): both engines on 2 prompts, few tokens, vLLM configs 0 and 1 and specmoe's ar and chain of 1,
one pass. Skipped without ``SPECMOE_VLLM_PYTHON`` (``bash docker/vllm_env.sh`` prints it).
"""

from __future__ import annotations

import argparse
import json
import os

import pytest
import torch
from fixtures.agreeing import VLLM_HEADS, bigram_eagle3, predictable_checkpoint

from specmoe.registry import targets
from specmoe_plugins.peers.vllm import bench as peer

VLLM_PYTHON = os.environ.get("SPECMOE_VLLM_PYTHON", "")
pytestmark = [pytest.mark.vllm]
if not VLLM_PYTHON:
    pytestmark.append(pytest.mark.skip(reason="SPECMOE_VLLM_PYTHON is not set: point it at the python of vLLM's "
                                              "environment (bash docker/vllm_env.sh prints it)"))


def test_bench_peer_runs_both_engines(tmp_path):


    torch.set_num_threads(1)
    target_dir = predictable_checkpoint("gpt_oss", tmp_path, out=tmp_path / "target", **VLLM_HEADS)
    draft = bigram_eagle3(targets.get("hf")(path=str(target_dir)), tmp_path / "draft")

    p = argparse.ArgumentParser()
    peer.add_arguments(p)
    args = p.parse_args(["--target", str(tmp_path / "target"), "--drafter-path", str(draft), "--random-prompts",
                         "8", "--prompts", "2", "--new-tokens", "12", "--max-drafts", "1", "--tree-shapes", "",
                         "--goodput", "", "--passes", "1", "--vllm-python", VLLM_PYTHON,
                         "--no-tracking", "--json", str(tmp_path / "peer.json"), "--keep-dir", str(tmp_path / "work")])
    assert peer.run(args) == 0
    r = json.loads((tmp_path / "peer.json").read_text())
    rows = r["rows"]
    assert list(rows) == ["vllm/no_spec", "specmoe/ar", "vllm/eagle3_chain1", "specmoe/chain1/confidence"]
    assert r["agreement_reference"] == "vllm/no_spec" and r["vllm"]["vllm_version"]
    for name, m in rows.items():
        assert m["agreement"] == 1.0, name  # greedy: both engines, with and without the draft, agree
        assert m["agreement_own"] == 1.0, name
        assert m["vs_vllm_best"] > 0
    assert max(m["vs_vllm_best"] for n, m in rows.items() if n.startswith("vllm/")) == 1.0
    # the same draft on the same prompts: one position, the same acceptance in both engines
    v, s = rows["vllm/eagle3_chain1"], rows["specmoe/chain1/confidence"]
    assert v["acceptance_by_position"][0] > 0
    assert len(v["acceptance_by_position"]) == len(s["acceptance_by_position"]) == 1
    # the runner hands on vLLM's per-step acceptance (what the headroom replay reads): one list per prompt, a
    # count per verify step, summing to the accepted drafts; one chain length gives no headroom line
    cell = next(run for run in json.loads((tmp_path / "work" / "vllm_out_0.json").read_text())["runs"]
                if run["num_speculative_tokens"] == 1)["cells"][0]
    assert len(cell["per_step_accepted"]) == 2 and sum(map(len, cell["per_step_accepted"])) == cell["drafts"]
    assert sum(map(sum, cell["per_step_accepted"])) == cell["accepted_tokens"]
    assert all(d == [1] * len(d) for d in cell["per_step_drafted"]) and r["headroom"] == []
