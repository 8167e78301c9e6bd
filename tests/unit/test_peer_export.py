# SPDX-License-Identifier: Apache-2.0
"""``platform peer export-policy`` (``specmoe_plugins/peers/vllm/export.py``): the vLLM plugin's policy file from
stage files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from specmoe.errors import UserError
from specmoe_plugins.peers.vllm import export

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "specmoe_vllm"))
from specmoe_vllm import policy as P  # noqa: E402


def _table_dir(root: Path, L=2, E=8, k=2) -> Path:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    d = root / "token_table"
    d.mkdir()
    (d / "token_table.json").write_text(json.dumps({"num_layers": L, "num_experts": E, "top_k": k}))
    ids = torch.arange(0, 20)
    experts = torch.stack([torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(L)]) for _ in ids])
    save_file({"token_ids": ids, "experts": experts.to(torch.int16),
               "fallback": torch.zeros(L, k, dtype=torch.int16) + torch.arange(k, dtype=torch.int16),
               "token_counts": torch.arange(1, 21)}, str(d / "token_table.safetensors"))
    return d


def _cost(root: Path, **coef) -> Path:
    p = root / "cost_model.json"
    p.write_text(json.dumps({"format": "specmoe.cost_model/1", "features": list(coef), "coef": coef, "meta": {}}))
    return p


def test_exported_policy_loads_in_the_plugin(tmp_path):
    pol = export.build_policy(token_table=str(_table_dir(tmp_path)),
                              cost_model=str(_cost(tmp_path, fixed=1e-3, tokens=1e-4, expert_layers=2e-5,
                                                   kv_slots=1e-8, padded_tokens=5e-5)),
                              vllm_run=None, acceptance=[0.9, 0.7])
    (tmp_path / "policy.json").write_text(json.dumps(pol))
    spec = P.load_policy(tmp_path / "policy.json")
    assert spec.cost.coef["tokens"] == pytest.approx(1.5e-4)  # padded tokens fold into tokens
    assert spec.cost.coef["expert_layers"] == pytest.approx(2e-5)
    assert spec.table.num_layers == 2 and len(spec.table.experts) == 20
    assert spec.prior["greedy"] == [0.9, 0.7]


def test_bad_inputs_name_the_file(tmp_path):
    with pytest.raises(UserError, match="token_table.json is missing"):
        export.read_token_table(tmp_path)
    (tmp_path / "c.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(UserError, match=r"--cost-model .*c\.json: 'format'"):
        export.read_cost_model(tmp_path / "c.json")
    with pytest.raises(UserError, match="needs a cost"):
        export.build_policy(token_table=None, cost_model=None, vllm_run=None, acceptance=None)
    with pytest.raises(UserError, match="give --token-table"):
        export.build_policy(token_table=None, cost_model=str(_cost(tmp_path, fixed=1e-3, expert_layers=1e-5)),
                            vllm_run=None, acceptance=None)


def test_vllm_runs_refit_the_step_cost_and_give_the_acceptance_prior(tmp_path):
    """Synthetic runner output from known per-step costs (fixed 2 ms, 0.3 ms per verified token, 0.5 ms per
    draft step, 0.4 ms for the drafter's pass of any speculative configuration): the fit recovers them (the
    drafter's pass as ``spec_pass``); the prior is the longest chain's conditional acceptance."""
    runs = []
    for n in range(4):
        tps = 1 + 0.8 * n
        steps = 100
        cells = [{"batch": b, "tokens": int(steps * tps * b), "tokens_per_step": tps,
                  "seconds": [steps * (2e-3 + 3e-4 * b * (1 + n) + 5e-4 * n + 4e-4 * (n > 0))]}
                 for b in (1, 4)]
        runs.append({"num_speculative_tokens": n, **cells[0], "cells": cells,
                     **({"drafts": steps, "acceptance_per_pos": [0.9, 0.72, 0.36][:n]} if n else {})})
    out = {"runs": runs}
    fit = export.fit_vllm_steps(out, {}, None)
    assert fit["fixed"] == pytest.approx(2e-3, rel=0.02)
    assert fit["spec_pass"] == pytest.approx(4e-4, rel=0.05)
    assert fit["tokens"] == pytest.approx(3e-4, rel=0.05)
    assert fit["draft_steps"] == pytest.approx(5e-4, rel=0.05)
    assert export.acceptance_from_run(out) == pytest.approx([0.9, 0.8, 0.5])
    (tmp_path / "run.json").write_text(json.dumps(out))
    pol = export.build_policy(token_table=None, cost_model=None, vllm_run=str(tmp_path / "run.json"),
                              acceptance=None)
    assert pol["acceptance"]["prior"]["greedy"] == pytest.approx([0.9, 0.8, 0.5]) and "experts" not in pol
