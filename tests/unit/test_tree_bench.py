# SPDX-License-Identifier: Apache-2.0
"""``platform bench tree``: the shapes option, and one small run on the predictable tiny target with a draft that
agrees with it (every method measured, the chain once, raw and calibrated trees, the calibration reported)."""

from __future__ import annotations

import argparse

import pytest

from specmoe.bench.target import bench_prompts
from specmoe.errors import UserError
from specmoe_plugins.benches import tree as bench_tree


def test_parse_shapes():
    assert bench_tree.parse_shapes("chain3=4/3/1, tree4w1=4/3/2/1") == {"chain3": (4, 3, 1, None),
                                                                       "tree4w1": (4, 3, 2, 1)}
    with pytest.raises(UserError, match="--shapes entry 'tree4=4/3'"):
        bench_tree.parse_shapes("tree4=4/3")
    with pytest.raises(UserError, match=">= 1"):
        bench_tree.parse_shapes("t=0/3/2")


def test_bench_tree_runs(make_predictable, agreeing_drafts):
    target, _ = make_predictable("gpt_oss")
    p = argparse.ArgumentParser()
    bench_tree.add_arguments(p)
    args = p.parse_args(["--drafter-path", str(agreeing_drafts("gpt_oss", "eagle3")), "--random-prompts", "9",
                         "--prompts", "3", "--new-tokens", "10", "--shapes", "chain3=4/3/1,tree4=4/3/2/1",
                         "--warmup", "2", "--verifier", "torch_union"])
    # the warm-up's prompts come after the measured ones, which do not depend on how many there are
    assert bench_prompts(target, args, 2)[:3] == bench_prompts(target, args)
    assert len(bench_prompts(target, args, 2)) == 5
    with pytest.raises(UserError, match="no tokenizer"):
        bench_tree.measure(target, p.parse_args(["--prompts", "1"]))
    r = bench_tree.measure(target, args)
    assert r["warmup"] == 2 and target.experts_implementation == "specmoe_torch_union"
    m = r["methods"]
    assert list(m) == ["chain3/confidence", "tree4/confidence/raw", "tree4/confidence/cal", "tree4/ecospec/raw",
                       "tree4/ecospec/cal"]
    assert m["chain3/confidence"]["verified_per_step"] == 4.0
    assert m["chain3/confidence"]["tokens_per_step"] > 1.0  # the draft agrees with the target
    for name, v in m.items():
        assert len(v["acceptance_by_position"]) == 3 and v["steps"] > 0
        assert ("calibration" in v) == name.endswith("/cal"), name
    assert "tree4/confidence/cal" in bench_tree._report(r, args)
