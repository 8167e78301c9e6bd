# SPDX-License-Identifier: Apache-2.0
"""The vLLM plugin's plain steps, without vLLM: when ``specmoe_vllm.drafter`` may skip the drafter (the
configuration check), and how the policy prices a step that skips it (``plain_steps``: no ``spec_pass`` cost
when the step verifies and proposes nothing). The proposer itself runs in vLLM: ``tests/vllm/test_plugin.py``.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "specmoe_vllm"))
from specmoe_vllm import drafter as D  # noqa: E402
from specmoe_vllm import policy as P  # noqa: E402


def _config(opts=None, method="eagle3", dp=1, **model):
    flags = {"is_hybrid": False, "has_inner_state": False, "uses_mrope": False, "supports_multimodal_inputs": False}
    flags.update(model)
    return SimpleNamespace(
        additional_config={} if opts is None else {"specmoe": opts},
        speculative_config=SimpleNamespace(method=method, parallel_drafting=False,
                                           disable_padded_drafter_batch=False),
        parallel_config=SimpleNamespace(data_parallel_size=dp), model_config=SimpleNamespace(**flags))


def test_the_drafter_is_skipped_only_where_the_plugin_asks_and_the_configuration_allows():
    assert D.skipping_wanted(_config({"policy": "p.json"})) == (True, "on")
    assert D.skipping_wanted(_config({"policy": "p.json", "skip_drafter": False}))[0] is False
    assert D.skipping_wanted(_config(None))[0] is False  # vLLM without the plugin's options: untouched
    for cfg, why in [(_config({}, method="ngram"), "method"), (_config({}, dp=2), "data parallel"),
                     (_config({}, is_hybrid=True), "is_hybrid"),
                     (_config({}, supports_multimodal_inputs=True), "supports_multimodal_inputs")]:
        on, msg = D.skipping_wanted(cfg)
        assert not on and why in msg


def test_install_waits_for_the_runner_module_without_importing_it():
    before = list(sys.meta_path)
    try:
        D.install()
        D.install()  # once only
        hooks = [f for f in sys.meta_path if isinstance(f, D._PatchOnImport)]
        assert len(hooks) == 1 and D.RUNNER_MODULE not in sys.modules
        assert hooks[0].find_spec("json") is None  # any other module: not its business
    finally:
        sys.meta_path[:] = before


def _spec(tmp_path, spec_pass, prior=(0.5, 0.5, 0.5)):
    d = {"format": P.FORMAT, "max_drafts": 3, "tolerance": 0.01,
         "cost": {"fixed": 1e-3, "tokens": 1e-4, "draft_steps": 0.0, "spec_pass": spec_pass},
         "acceptance": {"prior": {"greedy": list(prior)}, "strength": 20, "request_strength": 8}}
    p = tmp_path / "policy.json"
    p.write_text(json.dumps(d))
    return P.load_policy(p)


def test_a_plain_step_does_not_pay_the_speculative_machinery(tmp_path):
    """1 ms a pass, 0.1 ms a token, 0.8 ms for the speculative machinery, acceptance 0.5 per position: three
    drafts are worth 1.875 tokens in 2.2 ms (852 / s); plain decoding is 1 token in 1.1 ms (909 / s) where a step
    can skip the machinery, but 1.9 ms (526 / s) where every step pays it (vLLM's own way)."""
    spec = _spec(tmp_path, 8e-4)
    row = [P.Row("a", [5, 6, 7], 4, 100)]
    plain = P.GoodputPolicy(spec, 3, online=False, plain_steps=True).decide(row)
    assert plain.k == {"a": 0} and plain.k_next == 0 and plain.shape["spec_pass"] == 0
    assert plain.ar_rate == pytest.approx(1 / 1.1e-3)
    always = P.GoodputPolicy(spec, 3, online=False, plain_steps=False).decide(row)
    assert always.k == {"a": 3} and always.k_next == 3 and always.shape["spec_pass"] == 1
    assert always.rate == pytest.approx(1.875 / 2.2e-3)


def test_a_speculating_step_pays_the_machinery_once(tmp_path):
    """With high acceptance the plain-step policy speculates, and its first draft carries ``spec_pass`` (the rate
    of the choice counts it once, whatever the number of drafts)."""
    spec = _spec(tmp_path, 8e-4, prior=(0.95, 0.95, 0.95))
    pol = P.GoodputPolicy(spec, 3, online=False, plain_steps=True)
    d = pol.decide([P.Row("a", [5, 6, 7], 4, 100), P.Row("b", [8, 9], 4, 100)])
    assert d.k == {"a": 3, "b": 2} and d.k_next == 3 and d.shape["spec_pass"] == 1
    got = 2 + sum(pol.acceptance.chain("greedy", "a", 3)) + sum(pol.acceptance.chain("greedy", "b", 2))
    assert d.rate == pytest.approx(got / (1e-3 + 7 * 1e-4 + 8e-4))


def test_without_a_spec_pass_cost_plain_steps_change_nothing(tmp_path):
    spec = _spec(tmp_path, 0.0, prior=(0.8, 0.6, 0.4))
    rnd = random.Random(7)
    a = P.GoodputPolicy(spec, 3, online=False, plain_steps=True)
    b = P.GoodputPolicy(spec, 3, online=False, plain_steps=False)
    for _ in range(50):
        rows = [P.Row(str(i), [rnd.randrange(50) for _ in range(rnd.randrange(4))], 1, rnd.randrange(200))
                for i in range(rnd.randrange(1, 6))]
        da, db = a.decide(rows), b.decide(rows)
        assert (da.k, da.k_next) == (db.k, db.k_next)


def test_held_rows_are_counted_lost_only_when_not_replayed():
    h = D._Held()
    h.chunks.append(("t", "p", "h", "s"))
    h.rows = {"a": [(0, 0, 3)], "b": [(0, 3, 2)]}
    h.last = {"a": 12, "b": 40}
    h.total = 5
    h.drop("a")
    assert (h.total, h.dropped, sorted(h.rows)) == (2, 3, ["b"])
    h.drop("b", lost=False)  # a finished request: nobody drafts from it again
    assert (h.total, h.dropped, h.rows, h.chunks) == (0, 3, {}, [])
