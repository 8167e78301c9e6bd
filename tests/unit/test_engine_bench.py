# SPDX-License-Identifier: Apache-2.0
"""``platform bench engine`` runs end to end on a tiny target and reports every figure it promises; the op and
sync counter counts what it says."""

from __future__ import annotations

import argparse

import torch

from specmoe.bench.opcount import count_ops
from specmoe_plugins.benches.engine import bench


def test_counter_sees_host_reads_and_data_dependent_ops():
    x = torch.arange(6)
    with count_ops() as c:
        y = x * 2
        x.tolist()
        int(y[1])
        bool((y > 3).any())
        y.nonzero()
        _ = y[y > 3]
    assert c.syncs["tolist"] == 1 and c.syncs["_local_scalar_dense"] == 2 and c.syncs["nonzero"] == 1
    assert c.syncs["index(bool)"] == 1 and c.ops["mul"] == 1 and c.total_syncs == 5


def test_bench_engine_reports_everything(make_target, capsys):
    target = make_target("gpt_oss")
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--prompt-len", "16", "--new-tokens", "6", "--repeats", "1", "--prune-contexts", "16,64",
                         "--verifiers", "hf,torch_union"])
    r = bench.measure(target, args)
    for key in ("read_gb_s", "roofline_verify_ms", "verify_over_roofline", "step_over_roofline", "frac_overhead",
                "ar_vs_generate", "t_verify_ms", "t_total_ms"):
        assert r[key] > 0, key
    assert set(r["prune_us"]) == {16, 64} and all(v > 0 for v in r["prune_us"].values())
    assert r["counts"]["ops"]["verify"] > 0
    # verification reads nothing back but, on a CPU, the union experts loop's per-expert slot counts (one read
    # per MoE layer, free where host and device are one; GPUs take grouped_mm, which reads nothing)
    verify_reads = {k for k in r["counts"]["sync_kinds"] if k.startswith("verify:")}
    assert verify_reads <= {"verify:tolist"} and r["counts"]["syncs"]["verify"] <= target.num_moe_layers
    assert set(r["verifiers"]) == {"hf", "torch_union"} and all(v["ms"] > 0 for v in r["verifiers"].values())
    text = bench._report(r, args)
    assert "roofline" in text and "host syncs / step" in text and "KV pruning" in text


def test_bench_goodput_reports_everything(make_target):
    from specmoe_plugins.selectors.goodput import bench as goodput

    target = make_target("gpt_oss")
    p = argparse.ArgumentParser()
    goodput.add_arguments(p)
    # 11 steps per generation: each timed generation has a speculative step or >= 8 AR steps, both of which
    # reach the cost model (one AR step in 8 does)
    args = p.parse_args(["--prompts", "2", "--prompt-len", "8", "--new-tokens", "12", "--repeats", "1",
                         "--gammas", "2,4"])
    r = goodput.measure(target, args)
    assert set(r["tok_s"]) == {"ar", "confidence@2", "confidence@4", "goodput_tokens@4", "goodput@4"}
    assert all(v > 0 for v in r["tok_s"].values()) and r["vs_ar"]["ar"] == 1.0
    assert r["best_fixed"] in ("confidence@2", "confidence@4") and r["goodput_vs_best_fixed"] > 0
    assert r["cost_heldout"]["n"] > 0 and sum(r["ar_floor"].values()) > 0
    assert set(r["ar_step_share"]) == {"goodput_tokens@4", "goodput@4"}
    assert goodput._report(r, args).count("tok/s") == 5
