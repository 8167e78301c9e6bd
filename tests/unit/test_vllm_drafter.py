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
    h = D._Held(8)
    h.tok, h.pos, h.slot = [1] * 5, [1] * 5, [1] * 5
    h.rows = {"a": [(0, 3)], "b": [(3, 2)]}
    h.last = {"a": 12, "b": 40}
    h.total = 5
    h.drop("a")
    assert (h.total, h.dropped, sorted(h.rows), h.used) == (2, 3, ["b"], 5)
    h.drop("b", lost=False)  # a finished request: nobody drafts from it again
    assert (h.total, h.dropped, h.rows, h.used) == (0, 3, {}, 0)  # nobody holds rows: the arena is empty again


def test_the_arena_keeps_each_requests_rows_through_compaction():
    """Rows put step by step (a step's rows in request order), a request dropped, the arena filled past its end:
    the live rows are compacted to the front and every request still reads its own rows in position order."""
    torch = pytest.importorskip("torch")
    h = D._Held(9)
    want = {"a": [], "b": [], "c": []}

    def step(reqs, base):
        n = len(reqs)
        tok = list(range(base, base + n))
        hid = [torch.full((n, 2), float(base)), torch.arange(base, base + n, dtype=torch.float32)[:, None]]
        assert h.room(n)
        off = h.put(tok, [t + 1000 for t in tok], [t + 5000 for t in tok], hid)
        for i, r in enumerate(reqs):
            segs = h.rows.setdefault(r, [])
            segs.append((off + i, 1))
            h.total += 1
            want[r].append(base + i)

    step(["a", "b", "c"], 0)
    step(["a", "b", "c"], 10)
    h.drop("b")
    want.pop("b")
    step(["a", "c"], 20)
    assert h.used == 8
    step(["a", "c"], 30)  # 2 more rows do not fit after 8 of 9: the 6 live ones move to the front first
    assert (h.used, h.total) == (8, 8)
    assert not h.room(3)  # 8 live rows + 3 > 9: no room even compacted (vLLM's way for that step)
    for r, toks in want.items():
        idx = [i for s, c in h.rows[r] for i in range(s, s + c)]
        assert [h.tok[i] for i in idx] == toks
        assert [h.pos[i] for i in idx] == [t + 1000 for t in toks]
        assert [h.slot[i] for i in idx] == [t + 5000 for t in toks]
        assert h.hidden[idx, 2].tolist() == [float(t) for t in toks]  # the concatenated second part
        assert len(h.rows[r]) <= 2  # compacted to one segment, plus the step after it
