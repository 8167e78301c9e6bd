# SPDX-License-Identifier: Apache-2.0
"""The headline metrics against hand-computed values: experts_per_layer, routing_stats, the metrics registry's
summary (batch > 1, rows that finish early, empty steps), speedup / ρ / matches_ar, cells built from prompt
batches, interleaved evaluation groups (order, resumption), E vs E_pass, group keys and code versions."""

from __future__ import annotations

import json

import pytest
import torch

from specmoe.config.schema import Component, MethodConfig
from specmoe.decoding.engine import experts_per_layer, routing_stats
from specmoe.decoding.settings import DecodeSettings
from specmoe.decoding.stopping import StopRule
from specmoe.errors import CellFailed
from specmoe.evaluation.cell import build_cell, run_batch
from specmoe.evaluation.group import EvalGroup, Member
from specmoe.evaluation.method import Method
from specmoe.interfaces.dataset import Sample
from specmoe.metrics import METRICS, BatchTiming, CellData, derive, summarize

# routing [B=2, M=3, L=2, K=2] over E=6 experts; row 0 verifies 2 tokens, row 1 one (then padding)
ROUTING = torch.tensor([
    [[[0, 1], [2, 3]], [[1, 4], [3, 5]], [[5, 5], [0, 0]]],
    [[[0, 2], [1, 2]], [[3, 3], [4, 4]], [[5, 5], [5, 5]]],
])
VALID = torch.tensor([[True, True, False], [True, False, False]])


def test_experts_per_layer_counts_valid_tokens_and_the_whole_pass():
    assert experts_per_layer(ROUTING, VALID, 6) == [4, 4]  # {0,1,2,4} and {1,2,3,5}
    assert experts_per_layer(ROUTING, torch.ones_like(VALID), 6) == [6, 6]  # padding goes through experts
    assert experts_per_layer(ROUTING[:1, :1], VALID[:1, :1], 6) == [2, 2]  # one token: its top-K
    assert experts_per_layer(ROUTING, torch.zeros_like(VALID), 6) == [0, 0]  # an empty step


def test_routing_stats_cumulative_union_and_counts():
    cumulative, counts = routing_stats(ROUTING, VALID, 6)
    # after k tokens of every row: k=1 {0,1,2}/{1,2,3}; k=2 adds row 0's {1,4}/{3,5}; k=3 is padding
    assert cumulative == [3.0, 4.0, 4.0]
    assert counts.tolist() == [[2, 2, 1, 0, 1, 0], [0, 1, 2, 2, 0, 1]]
    cumulative, counts = routing_stats(ROUTING, torch.zeros_like(VALID), 6)
    assert cumulative == [0.0, 0.0, 0.0] and int(counts.sum()) == 0


def _step(accepted, experts, passed, predicted, t, hits, total):
    return {"accepted": accepted, "verified": [4] * len(accepted), "experts_per_layer": experts,
            "pass_experts_per_layer": passed, "predicted_per_layer": predicted, "t_draft": t[0], "t_pred": t[1],
            "t_select": t[2], "t_verify": t[3], "t_total": t[4], "pred_hits": hits, "pred_total": total}


# batch of 2 rows; row 1 finishes after step 1, so step 2 has one active row
STEPS = [_step([3, 2], [4, 6], [5, 6], [3, 5], (0.010, 0.002, 0.001, 0.020, 0.040), 10, 16),
         _step([1], [2, 2], [4, 6], [2, 2], (0.012, 0.002, 0.001, 0.030, 0.050), 6, 8)]


def test_summarize_batch_rows_finishing_early():
    data = CellData(steps=STEPS, batches=[BatchTiming(12, 0.5), BatchTiming(6, 0.2)],
                    outputs=[[1] * 6, [2] * 3, [3] * 9], bytes_per_expert=1000, num_moe_layers=2)
    m = summarize(data)
    assert m["alpha"] == pytest.approx((3 + 2 + 1) / 3)  # mean over (step, active row)
    assert m["E"] == pytest.approx((5 + 2) / 2)  # mean over steps of the per-layer mean
    assert m["E_pass"] == pytest.approx((5.5 + 5) / 2)
    assert m["E_pred"] == pytest.approx((4 + 2) / 2)
    assert m["expert_bytes_per_step"] == pytest.approx(5.25 * 2 * 1000)  # from E_pass: the work done
    assert m["t_verify"] == pytest.approx(0.025) and m["t_total"] == pytest.approx(0.045)
    assert m["t_draft"] == pytest.approx(0.011) and m["t_pred"] == pytest.approx(0.002)
    assert m["tokens_per_s"] == pytest.approx((12 / 0.5 + 6 / 0.2) / 2)  # mean over batches (Spec-Bench)
    assert m["predictor_accuracy"] == pytest.approx(16 / 24)
    assert m["steps"] == 2 and m["new_tokens"] == 18
    assert "speedup" not in m and "matches_ar" not in m  # relative metrics need the AR cell


def test_summarize_empty_steps_and_ar():
    empty = CellData(steps=[], batches=[BatchTiming(1, 0.1)], outputs=[[7]])
    m = summarize(empty)  # the first token ended every prompt: no verification step
    assert set(m) == {"tokens_per_s", "steps", "new_tokens"}
    assert m["tokens_per_s"] == pytest.approx(10) and m["steps"] == 0 and m["new_tokens"] == 1
    ar = summarize(CellData(steps=[_step([1, 1], [2, 3], [2, 3], None, (0, 0, 0, 0.01, 0.011), 0, 0)],
                            batches=[BatchTiming(2, 0.1)], outputs=[[1], [2]]), autoregressive=True)
    assert ar["alpha"] == 1.0 and ar["E"] == 2.5 and "t_verify" not in ar and "predictor_accuracy" not in ar


def test_derive_speedup_rho_matches_ar():
    cell = CellData(outputs=[[1, 2], [3]], temperature=0.0)
    ar = CellData(outputs=[[1, 2], [4]], temperature=0.0)
    m = {"tokens_per_s": 27.0, "t_verify": 0.025}
    a = {"tokens_per_s": 18.0, "t_total": 0.005}
    d = derive(cell, ar, m, a)
    assert d == {"speedup": pytest.approx(1.5), "rho": pytest.approx(0.2), "matches_ar": 0.5}
    sampled = derive(CellData(outputs=[[1]], temperature=1.0), CellData(outputs=[[1]], temperature=1.0), m, a)
    assert "matches_ar" not in sampled  # only greedy decoding must equal AR
    assert derive(ar, ar, a, a, autoregressive=True) == {"speedup": 1.0}
    assert derive(cell, ar, {}, a) == {"matches_ar": 0.5}  # no timings: no speedup, no ρ


def test_every_metric_declares_how_it_is_computed_and_shown():
    for m in METRICS.values():
        assert m.label and m.description and m.aggregate and m.unit, m.name
        assert m.format(1.0) and m.format(None) == "n/a"


def _batch(new_tokens, seconds, ids, counts=None):
    return {"seconds": seconds, "new_tokens": new_tokens, "expert_counts": counts, "steps": STEPS[:1],
            "samples": [{"id": i, "turns": [f"answer {i}"], "tokens": [[5] * (new_tokens // len(ids))]}
                        for i in ids]}


def test_build_cell_from_batches():
    batches = [_batch(4, 0.5, ["a", "b"], [[1, 0], [0, 1]]), _batch(2, 0.25, ["c"], [[1, 1], [1, 1]])]
    cell, data = build_cell(batches, method="m", dataset="d", temperature=0.0, budget=4, batch_size=2,
                            autoregressive=False, analysis_only=False, bytes_per_expert=10, num_moe_layers=2)
    assert [p["id"] for p in cell.per_sample] == ["a", "b", "c"]
    assert [p["batch_tokens_per_s"] for p in cell.per_sample] == [8.0, 8.0, 8.0]
    assert cell.expert_counts == [[2, 1], [1, 2]] and len(cell.steps) == 2
    assert cell.metrics["tokens_per_s"] == 8.0 and data.outputs == [[5, 5], [5, 5], [5, 5]]
    assert cell.label == "m / d / T=0.0 / γ=4 / bs=2"


# ------------------------------------------------------------------ on a tiny target
@pytest.fixture(scope="module")
def target(make_target):
    return make_target("qwen3_moe")


def _methods(target):
    ar = Method(MethodConfig(name="ar", verifier=Component("hf", {}, "verifier")), target, lambda x: x)
    sd = Method(MethodConfig(name="sd", drafter=Component("draft_model", {"share_target": True}, "drafter"),
                             selector=Component("confidence", {}, "selector"),
                             verifier=Component("hf", {}, "verifier")), target, lambda x: x)
    return ar, sd


def _render(target):
    return lambda sample, turn, answers: [(7 * len(sample.turns[turn]) + 13 * i + 3 * len(answers)) %
                                          target.vocab_size for i in range(6)]


def _decode(ids):
    return " ".join(map(str, ids))


def test_run_batch_multi_turn_and_e_pass(target):
    ar, sd = _methods(target)
    samples = [Sample(id="a", turns=["one", "two"]), Sample(id="b", turns=["three"])]
    settings = DecodeSettings(budget=4, temperature=0.0, steps=3, top_k=2, stop=StopRule(6), seed=0)
    rec = run_batch(sd, samples, _render(target), _decode, settings)
    a, b = rec["samples"]
    assert len(a["tokens"]) == 2 and len(b["tokens"]) == 1  # the second turn only for the 2-turn sample
    assert rec["new_tokens"] == sum(len(t) for s in rec["samples"] for t in s["tokens"]) == 18
    assert rec["seconds"] > 0 and a["turns"][0] == _decode(a["tokens"][0])
    steps = rec["steps"]
    assert all(s["pass_experts_per_layer"][i] >= s["experts_per_layer"][i]
               for s in steps for i in range(len(s["experts_per_layer"])))
    # batch size 1 (the second turn): no padding, so E_pass = E
    single = run_batch(sd, samples[1:], _render(target), _decode, settings)["steps"]
    assert all(s["pass_experts_per_layer"] == s["experts_per_layer"] for s in single)
    ar_rec = run_batch(ar, samples[1:], _render(target), _decode, settings)
    assert ar_rec["samples"][0]["tokens"] == run_batch(sd, samples[1:], _render(target), _decode,
                                                       settings)["samples"][0]["tokens"]  # lossless


def _group(tmp_path, target, members, samples):
    return EvalGroup(tmp_path / "g", members, samples, dataset="toy", temperature=0.0, batch_size=1,
                     render=_render(target), decode=_decode, decoding=DecodeSettings(1, 3, 2, 0.0, StopRule(4)),
                     warmup=0, seed=0, target_facts={"bytes_per_expert": 8, "num_moe_layers": 2})


def test_group_interleaves_rotates_and_resumes(target, tmp_path):
    (ar, sd), (_, sd4) = _methods(target), _methods(target)
    calls: list[str] = []
    broken = {"on": True}

    def recorded(method, label, fail_at=None):  # the real method, its calls recorded
        real = method.generate

        def generate(prompts, settings):
            calls.append(label)
            if fail_at is not None and broken["on"] and calls.count(label) == fail_at:
                raise RuntimeError("device lost")
            return real(prompts, settings)

        method.generate = generate
        return lambda: method

    samples = [Sample(id=f"s{i}", turns=[f"question {i}" * (i + 1)]) for i in range(3)]
    members = [Member("ar", 1, recorded(ar, "ar"), autoregressive=True), Member("sd", 3, recorded(sd, "sd3")),
               Member("sd", 4, recorded(sd4, "sd4", fail_at=2))]
    group = _group(tmp_path, target, members, samples)
    with pytest.raises(CellFailed, match=r"sd / toy / T=0.0 / γ=4 / bs=1 failed: RuntimeError: device lost"):
        group.run()
    assert (tmp_path / "g" / "batch-00000.json").is_file() and not (tmp_path / "g" / "batch-00001.json").exists()
    assert calls == ["ar", "sd3", "sd4", "sd3", "sd4"]  # batch 1 starts with the next member
    broken["on"] = False
    calls.clear()
    (ar, sd), (_, sd4) = _methods(target), _methods(target)  # a new process: fresh methods
    members = [Member("ar", 1, recorded(ar, "ar"), autoregressive=True), Member("sd", 3, recorded(sd, "sd3")),
               Member("sd", 4, recorded(sd4, "sd4"))]
    cells = _group(tmp_path, target, members, samples).run()
    assert calls == ["sd3", "sd4", "ar", "sd4", "ar", "sd3"]  # batch 0 kept; batches 1, 2 rotated
    assert [c.label for c in cells] == ["ar / toy / T=0.0 / bs=1", "sd / toy / T=0.0 / γ=3 / bs=1",
                                        "sd / toy / T=0.0 / γ=4 / bs=1"]
    ar_cell = cells[0]
    for c in cells[1:]:
        assert c.metrics["matches_ar"] == 1.0
        assert c.metrics["speedup"] == pytest.approx(c.metrics["tokens_per_s"] / ar_cell.metrics["tokens_per_s"])
    assert ar_cell.metrics["speedup"] == 1.0 and [p["id"] for p in ar_cell.per_sample] == ["s0", "s1", "s2"]
    assert not list((tmp_path / "g").glob("batch-*.json")) and (tmp_path / "g" / "cells.json").is_file()
    again = _group(tmp_path, target, members, samples).run()  # finished: read back, nothing measured
    assert all(c.cached for c in again) and json.dumps(again[1].metrics) == json.dumps(cells[1].metrics)


def test_group_repeats_rotate_and_keep_the_fastest_round(target, tmp_path):
    """``eval.repeats``: every batch runs R rounds per member, rotated on; a member's batch is its fastest round,
    whole, with every round's seconds kept; the cell reports their spread."""
    ar, sd = _methods(target)
    calls: list[str] = []
    walls: dict[str, list[float]] = {"ar": [], "sd": []}

    def recorded(method, label):
        real = method.generate

        def generate(prompts, settings):
            calls.append(label)
            out = real(prompts, settings)
            walls[label].append(out.wall_time)
            return out

        method.generate = generate
        return lambda: method

    samples = [Sample(id=f"s{i}", turns=[f"question {i}" * (i + 1)]) for i in range(2)]
    members = [Member("ar", 1, recorded(ar, "ar"), autoregressive=True), Member("sd", 3, recorded(sd, "sd"))]
    group = _group(tmp_path, target, members, samples)
    group.repeats = 3
    assert group.generations() == 2 * 2 * 3
    cells = group.run()
    # batch 0: rounds start with members 0, 1, 0; batch 1 (rounds 3, 4, 5): 1, 0, 1
    assert calls == ["ar", "sd", "sd", "ar", "ar", "sd", "sd", "ar", "ar", "sd", "sd", "ar"]
    for cell, label in zip(cells, ("ar", "sd")):
        rounds = [walls[label][:3], walls[label][3:]]
        assert [b["seconds"] for b in cell.per_sample] == [min(r) for r in rounds]  # one sample per batch
        spread = sorted(max(r) / min(r) - 1.0 for r in rounds)
        assert cell.metrics["round_spread"] == pytest.approx(sum(spread) / 2)
    assert cells[1].metrics["matches_ar"] == 1.0 and cells[1].metrics["alpha"] > 1.0
    single = _group(tmp_path / "one", target, [Member("ar", 1, lambda: ar, autoregressive=True)], samples).run()
    assert "round_spread" not in single[0].metrics


def test_eval_repeats_and_warmup_are_checked(tmp_path):
    from specmoe.config.errors import ConfigError
    from specmoe.config.load import load_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: k\ntarget: {name: hf, tiny: {arch: qwen3_moe}}\ndatasets: [{name: gsm8k, limit: 2}]\n"
                      "methods: [{name: ar}]\neval: {repeats: 0, warmup: -1}\n")
    with pytest.raises(ConfigError) as err:
        load_recipe(recipe)
    text = str(err.value)
    assert "eval.repeats" in text and "must be >= 1" in text and "eval.warmup" in text and str(recipe) in text
    assert load_recipe(recipe, ["eval.repeats=2", "eval.warmup=0"]).eval.repeats == 2


def test_group_key_changes_with_the_code_version(tmp_path):
    from specmoe.config.load import load_recipe
    from specmoe.evaluation.runner import Evaluator

    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: k\ntarget: {name: hf, tiny: {arch: qwen3_moe}}\ndatasets: [{name: gsm8k, limit: 2}]\n"
                      "methods: [{name: sd, drafter: {name: draft_model, share_target: true}}]\n")
    cfg = load_recipe(recipe)

    def key(code):
        ev = Evaluator(cfg, None, lambda x: x, lambda x: x, {}, None, None, tmp_path, code=code)
        return ev.group_key(cfg.datasets[0], 0.0, 1)

    base = {"specmoe": "0.1.0", "source": "a" * 16, "plugins": {"specmoe_plugins": "c" * 16}}
    assert key(base) == key(dict(base))
    assert key(base) != key({**base, "source": "b" * 16})
    assert key(base) != key({**base, "plugins": {"specmoe_plugins": "d" * 16}})
    assert key(base) != key({**base, "specmoe": "0.2.0"})
    one_round = key(base)
    cfg.eval.repeats = 3
    assert key(base) != one_round  # timings of a different number of rounds are not mixed


def test_method_budgets_override_the_grid(tmp_path):
    """A method's own ``budgets`` replace ``eval.budgets`` for it; without any, members and keys are as before."""
    from specmoe.config.load import load_recipe
    from specmoe.evaluation.runner import Evaluator

    recipe = tmp_path / "r.yaml"
    body = ("name: k\ntarget: {name: hf, tiny: {arch: qwen3_moe}}\ndatasets: [{name: gsm8k, limit: 2}]\n"
            "eval: {budgets: [2, 4]}\nmethods: [{name: a, drafter: {name: draft_model, share_target: true}}, "
            "{name: b, drafter: {name: draft_model, share_target: true}%s}]\n")
    recipe.write_text(body % ", budgets: [8, 4]")
    ev = Evaluator(load_recipe(recipe), None, lambda x: x, lambda x: x, {}, None, None, tmp_path)
    assert [m.id for m in ev._members()] == ["ar@1", "a@2", "a@4", "b@4", "b@8"]
    recipe.write_text(body % "")
    ev = Evaluator(load_recipe(recipe), None, lambda x: x, lambda x: x, {}, None, None, tmp_path)
    assert [m.id for m in ev._members()] == ["ar@1", "a@2", "b@2", "a@4", "b@4"]
