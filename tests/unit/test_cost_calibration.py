# SPDX-License-Identifier: Apache-2.0
"""``platform bench goodput_cost`` (was ``expert_latency --calibrate``) on a tiny target: the grid, forced unions
reaching the real experts in the engine's verification call, the fitted model saved as JSON with its errors, the
engine check; the ``calibrate_cost`` stage."""

from __future__ import annotations

import argparse

import pytest

from specmoe.bench import expert_latency
from specmoe.cli.main import main
from specmoe.errors import UserError
from specmoe_plugins.selectors.goodput import calibration as cost_calibration
from specmoe_plugins.selectors.goodput import cost_bench
from specmoe_plugins.selectors.goodput.cost_model import CostModel


def test_grid_spans_the_unions():
    g = cost_calibration.grid(top_k=2, num_experts=8, gammas=[1, 4], batches=[1, 2], contexts=[16], unions_per_t=3)
    assert (1, 16, 1, 2) in g and (1, 16, 4, 8) in g and (2, 16, 4, 8) in g
    assert [u for b, c, gm, u in g if (b, gm) == (1, 1)] == [2]  # one token: only top_k experts
    assert [u for b, c, gm, u in g if (b, gm) == (1, 4)] == [2, 5, 8]
    assert all(2 <= u <= min(8, b * gm * 2) for b, c, gm, u in g)


def test_calibration_forces_the_unions(make_target):
    target = make_target("gpt_oss")
    seen: list[int] = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: seen.append(int(args[1].unique().numel())))
             for m in target.experts_modules()]
    configs = [(1, 8, 4, 3), (2, 8, 2, 6)]
    try:
        recs = cost_calibration.calibrate(target, configs, iters=1, warmup=0, seed=0)
    finally:
        for h in hooks:
            h.remove()
    layers = len(target.experts_modules())
    timed = seen[-2 * layers:]  # prefills of the two (batch, context) caches come first
    assert sorted(timed) == [3] * layers + [6] * layers
    assert sorted((r["batch"], r["gamma"], r["union"]) for r in recs) == [(1, 4, 3), (2, 2, 6)]
    assert all(r["seconds"] > 0 for r in recs)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cost_bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_calibrate_cli_saves_a_cost_model(make_target, tmp_path, capsys):
    """Through the CLI: ``platform bench goodput_cost`` is the plugin's entry point in ``specmoe.benches``."""
    target = make_target("gpt_oss")
    out = tmp_path / "stage"
    rc = main(["bench", "goodput_cost", "--target", target.path, "--gammas", "1,4", "--batches", "1,2",
               "--contexts", "8,24", "--unions-per-t", "2", "--iters", "2", "--warmup", "0",
               "--clock", "thread", "--check-steps", "2", "--save", str(out), "--threads", "1",
               "--features", "fixed,tokens,expert_layers,kv_slots", "--features", "fixed,tokens,expert_layers"])
    assert rc == 0
    text = capsys.readouterr().out
    assert text.count("T_verify = ") == 2 and text.count("held-out calls") == 2 and "engine, online" in text
    model = CostModel.load(out / "cost_model.json")
    assert set(model.features) == {"fixed", "tokens", "expert_layers", "kv_slots"}
    assert all(c >= 0 for c in model.coefficients().values()) and model.coefficient("fixed") > 0
    fit = model.meta["fit"]
    configs = cost_calibration.grid(2, 8, gammas=[1, 4], batches=[1, 2], contexts=[8, 24], unions_per_t=2)
    assert len(configs) == 14  # per context: (1 row, 1 token) has one union, the three others two
    assert fit["train"]["n"] + fit["heldout_calls"]["n"] == 2 * len(configs)  # 2 rounds
    assert fit["engine_steps"]["offline"]["n"] > 0
    assert model.meta["layers"] == 4 and model.meta["top_k"] == 2 and model.meta["clock"] == "thread"


def test_calibrate_cli_rejects_bad_features(make_target, tmp_path):
    from specmoe.errors import UserError

    target = make_target("gpt_oss")
    with pytest.raises(UserError, match="--features"):
        cost_bench.run(_args("--target", target.path, "--features", "fixed,flops", "--save", str(tmp_path)))


def test_expert_latency_calibrate_names_its_new_place(tmp_path):
    parser = argparse.ArgumentParser()
    expert_latency.add_arguments(parser)
    with pytest.raises(UserError, match="--calibrate moved: .*'platform bench goodput_cost --target DIR'"):
        expert_latency.run(parser.parse_args(["--target", str(tmp_path), "--calibrate"]))


def test_calibrate_cost_stage_writes_a_loadable_model_keyed_by_the_machine(tiny_cache, tmp_path):
    """The ``calibrate_cost`` stage (the recipes' offline cost model): sweep, fit, JSON a goodput selector
    loads, errors in its summary; the machine's CPU / GPUs and torch's thread count are in its cache key."""
    import torch

    from specmoe.interfaces.stage import StageContext
    from specmoe.registry import selectors, stages
    from specmoe.stages.runner import stage_key_blob

    cls = stages.get("calibrate_cost")
    cfg = cls.Config(target={"tiny": {"arch": "gpt_oss"}, "cache_dir": str(tiny_cache)}, gammas=[1, 4],
                     batches=[1, 2], contexts=[16], unions_per_t=2, iters=2, warmup=0)
    summary = cls(cfg).run(tmp_path, StageContext())
    assert summary["calls"] == 2 * summary["configurations"] > 0
    assert 0 <= summary["heldout_median_abs_rel_error"] < float("inf")
    model = CostModel.load(tmp_path / "cost_model.json")
    assert model.meta["layers"] > 0 and model.meta["clock"] == "wall"
    # some term carries the measured time; which one depends on the machine and its load (two timed calls per
    # configuration: under load the fit once put it all on the expert and KV terms, fixed and tokens 0)
    assert any(v > 0 for v in model.coefficients().values())
    sel = selectors.get("goodput")(cost_model=str(tmp_path / "cost_model.json"))
    assert sel.cost.coefficients() == pytest.approx(model.coefficients())
    facts = cls.key_facts({})
    assert facts["threads"] == torch.get_num_threads() and facts["cpu"]
    assert stage_key_blob("calibrate_cost", cls.version, {}, facts)["facts"] == facts
    with pytest.raises(UserError, match="calibrate_cost.features"):
        cls(cls.Config(target={"tiny": {"arch": "gpt_oss"}}, features=["tokens", "nope"])).run(tmp_path, StageContext())
