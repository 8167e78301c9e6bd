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


def _table_dir(root: Path, L=2, E=8, k=2, **meta) -> Path:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    d = root / "token_table"
    d.mkdir()
    (d / "token_table.json").write_text(json.dumps({"num_layers": L, "num_experts": E, "top_k": k, **meta}))
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
    assert "accuracy" not in pol["experts"] and spec.table.accuracy == 1.0  # a table without test_acc


def test_the_tables_held_out_accuracy_is_the_policys(tmp_path):
    """The stage's ``test_acc`` (held-out top-K accuracy) becomes ``experts.accuracy``, read by the plugin."""
    pol = export.build_policy(token_table=str(_table_dir(tmp_path, test_acc=0.73)),
                              cost_model=str(_cost(tmp_path, fixed=1e-3, tokens=1e-4, expert_layers=2e-5)),
                              vllm_run=None, acceptance=[0.9])
    (tmp_path / "policy.json").write_text(json.dumps(pol))
    assert pol["experts"]["accuracy"] == 0.73 and P.load_policy(tmp_path / "policy.json").table.accuracy == 0.73


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
        acc = {"drafts": steps, "acceptance_per_pos": [0.9, 0.72, 0.36][:n]} if n else {}
        cells = [{"batch": b, "tokens": int(steps * tps * b), "tokens_per_step": tps,
                  "seconds": [steps * (2e-3 + 3e-4 * b * (1 + n) + 5e-4 * n + 4e-4 * (n > 0))], **acc}
                 for b in (1, 4)]
        runs.append({"num_speculative_tokens": n, **cells[0], "cells": cells})
    out = {"runs": runs}
    fit, fit_tokens = export.fit_vllm_steps(out, {}, None)
    assert fit_tokens is None  # no table: the cost is token-only already
    assert fit["fixed"] == pytest.approx(2e-3, rel=0.02)
    assert fit["spec_pass"] == pytest.approx(4e-4, rel=0.05)
    assert fit["tokens"] == pytest.approx(3e-4, rel=0.05)
    assert fit["draft_steps"] == pytest.approx(5e-4, rel=0.05)
    assert export.acceptance_from_run(out) == pytest.approx([0.9, 0.8, 0.5])
    (tmp_path / "run.json").write_text(json.dumps(out))
    pol = export.build_policy(token_table=None, cost_model=None, vllm_run=str(tmp_path / "run.json"),
                              acceptance=None)
    assert pol["acceptance"]["prior"]["greedy"] == pytest.approx([0.9, 0.8, 0.5]) and "experts" not in pol


def test_the_fit_prices_sampled_tokens_apart():
    """Cells at T = 0 and T = 1 whose T = 1 steps cost 0.3 ms more per verified token: the fit's
    ``sampled_tokens`` recovers it and the other terms stay those of the T = 0 steps."""
    runs = []
    for n in range(4):
        tps = 1 + 0.8 * n
        cells = []
        for b in (1, 4, 8):
            for t in (0.0, 1.0):
                sec = 2e-3 + 2e-4 * b + 3e-4 * b * (1 + n) * (2 if t else 1) + 5e-4 * n + 4e-4 * (n > 0)
                cells.append({"batch": b, "temperature": t, "tokens": int(100 * tps * b), "tokens_per_step": tps,
                              "seconds": [100 * sec]})
        runs.append({"name": f"eagle3_chain{n}", "num_speculative_tokens": n, **cells[0], "cells": cells})
    fit, _ = export.fit_vllm_steps({"runs": runs}, {}, None)
    assert fit["sampled_tokens"] == pytest.approx(3e-4, rel=0.05)
    assert fit["tokens"] == pytest.approx(3e-4, rel=0.05) and fit["fixed"] == pytest.approx(2e-3, rel=0.05)
    t0 = [{**r, "cells": [c for c in r["cells"] if c["temperature"] == 0.0]} for r in runs]
    assert export.fit_vllm_steps({"runs": t0}, {}, None)[0]["sampled_tokens"] == 0.0  # one kind: not fitted


def test_acceptance_prior_by_kind_pools_the_longest_fixed_chains_cells():
    """Greedy and sampled priors come from the longest *fixed* chain's T = 0 and T > 0 cells (pooled over batch
    sizes by their drafts); a plugin run with as many drafts is not a fixed chain. Without sampled cells the
    sampled prior is 0.9 x greedy."""
    def cell(b, t, drafts, per_pos):
        return {"batch": b, "temperature": t, "tokens": 100, "tokens_per_step": 2.0, "seconds": [1.0],
                "drafts": drafts, "accepted_per_pos": per_pos}
    chain = {"name": "eagle3_chain2", "num_speculative_tokens": 2, "drafts": 100,
             "cells": [cell(1, 0.0, 100, [90, 45]), cell(4, 0.0, 300, [270, 135]), cell(1, 1.0, 200, [20, 10])]}
    plugin = {"name": "plugin", "num_speculative_tokens": 2, "drafts": 50, "cells": [cell(1, 0.0, 50, [1, 0])]}
    out = {"runs": [{"name": "no_spec", "num_speculative_tokens": 0, "cells": [cell(1, 0.0, 0, [])]}, chain, plugin]}
    assert export.acceptance_from_run(out) == pytest.approx([0.9, 0.5])
    assert export.acceptance_from_run(out, sampled=True) == pytest.approx([0.1, 0.5])
    chain["cells"] = chain["cells"][:2]
    assert export.acceptance_from_run(out, sampled=True) is None


# vLLM's CPU step seconds of the demo's target + EAGLE-3 draft on a Sapphire Rapids (bench peer, fp32, T = 0):
# per batch size, ms per step with 0..5 drafts per request
_MEASURED_MS = {1: [4.98, 9.08, 11.74, 14.84, 16.82, 19.16], 4: [8.96, 15.37, 20.24, 24.67, 28.39, 31.31],
                8: [11.93, 20.95, 31.43, 31.97, 42.79, 41.59]}


def _measured_run() -> dict:
    runs = []
    for n in range(6):
        tps = 1 + 0.7 * n
        cells = [{"batch": b, "temperature": 0.0, "tokens": int(round(100 * tps * b)), "tokens_per_step": tps,
                  "seconds": [100 * ms[n] * 1e-3]} for b, ms in _MEASURED_MS.items()]
        runs.append({"num_speculative_tokens": n, **cells[0], "cells": cells})
    return {"runs": runs}


def _table_32x4(root: Path) -> Path:
    """A token table shaped like the demo target's: 4 MoE layers, 32 experts, top-4, skewed token counts."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(1)
    d = root / "table32"
    d.mkdir()
    (d / "token_table.json").write_text(json.dumps({"num_layers": 4, "num_experts": 32, "top_k": 4}))
    n = 200
    experts = torch.stack([torch.stack([torch.randperm(32, generator=g)[:4] for _ in range(4)]) for _ in range(n)])
    save_file({"token_ids": torch.arange(n), "experts": experts.to(torch.int16),
               "fallback": torch.arange(4, dtype=torch.int16).repeat(4, 1),
               "token_counts": (1000 // torch.arange(1, n + 1)).clamp(min=1)}, str(d / "token_table.safetensors"))
    return d


def _predict(cost: dict, table: dict | None, b: int, n: int) -> float:
    v = b * (1 + n)
    u = export._expected_union(table, v) if table and cost.get("expert_layers") else 0.0
    return (cost["fixed"] + cost.get("rows", 0.0) * b + cost["tokens"] * v + cost["draft_steps"] * n
            + cost.get("spec_pass", 0.0) * (n > 0) + cost.get("expert_layers", 0.0) * u)


def test_fit_follows_the_concave_step_cost_across_batch_sizes(tmp_path):
    """On vLLM's measured step seconds (batch 1, 4, 8 x 0..5 drafts) the fitted cost predicts every cell within
    15 %, with the expert union and without it (the token-only variant's ``cost_tokens``): the concavity in the
    token count comes from ``rows`` and the union. One coefficient per verified token across batch sizes (the
    fit before) priced a batch-8 step of 5 drafts at ~3x its measured seconds."""
    table = export.read_token_table(_table_32x4(tmp_path))
    run = _measured_run()
    cost, cost_tokens = export.fit_vllm_steps(run, {"kv_slots": 1e-9}, table)
    assert cost["expert_layers"] > 0 and cost_tokens["expert_layers"] == 0 and cost["kv_slots"] == 1e-9
    assert all(v >= 0 for c in (cost, cost_tokens) for v in c.values())
    for c, tab in ((cost, table), (cost_tokens, None)):
        for b, ms in _MEASURED_MS.items():
            for n, m in enumerate(ms):
                assert _predict(c, tab, b, n) == pytest.approx(m * 1e-3, rel=0.15), (b, n, c)
    (tmp_path / "run.json").write_text(json.dumps(run))
    pol = export.build_policy(token_table=str(tmp_path / "table32"), cost_model=None,
                              vllm_run=str(tmp_path / "run.json"), acceptance=None)
    (tmp_path / "policy.json").write_text(json.dumps(pol))
    spec = P.load_policy(tmp_path / "policy.json")
    assert spec.cost_tokens is not None and spec.cost_tokens.coef["rows"] == pytest.approx(cost_tokens["rows"])
    # the plugin prices a step as the fit does: batch 8, 5 drafts per request
    pol_e = P.GoodputPolicy(spec, 5, online=False)
    pol_t = P.GoodputPolicy(spec, 5, online=False, expert_cost=False)
    assert pol_t.cost.current.coef == spec.cost_tokens.coef and pol_e.cost.current.coef == spec.cost.coef
    x = P._shape(8, 48, 0.0, 0.0, 5, 1.0)
    assert pol_t.cost.current.seconds(x, False) == pytest.approx(41.59e-3, rel=0.15)


def test_one_batch_size_fits_drafts_not_tokens(tmp_path):
    """At one batch size the verified tokens and the drafts are collinear: the fit prices a verified draft through
    its draft pass and leaves ``rows`` and ``tokens`` at 0 instead of splitting them arbitrarily, so cutting a held
    draft saves nothing the policy believes (its pass is paid), and a proposal still pays the whole."""
    run = _measured_run()
    for r in run["runs"]:
        r["cells"] = r["cells"][:1]
    cost, _ = export.fit_vllm_steps(run, {}, None)
    assert cost["rows"] == 0 and cost["tokens"] == 0 and cost["draft_steps"] > 0
    # the expected union of 1 + n tokens is a function of n alone here: no expert term (it took the drafts' cost)
    with_table, token_only = export.fit_vllm_steps(run, {}, export.read_token_table(_table_32x4(tmp_path)))
    assert with_table["expert_layers"] == 0 and with_table["draft_steps"] > 0 and token_only is None
    for n, m in enumerate(_MEASURED_MS[1]):
        assert _predict(cost, None, 1, n) == pytest.approx(m * 1e-3, rel=0.15)
