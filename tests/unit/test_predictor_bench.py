# SPDX-License-Identifier: Apache-2.0
"""``platform bench draft_head`` (``platform bench predictor`` until 0.2): the draft head at GPT-OSS-120B dimensions
(one row per head) and the demo-size comparison with ``learned`` (its real plugin: observe + tree predict on a
target)."""

from __future__ import annotations

import argparse

import torch

from specmoe.registry import benches

bench = benches.get("draft_head")  # the draft_head predictor's bench, found through the entry-point group


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_prints_one_row_per_head(capsys):
    assert bench.run(_args("--heads", "mlp:8,lowrank:8,linear", "--no-demo", "--trees", "1", "--repeats", "1")) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("gptoss120b")]
    assert [r[1:4] for r in rows] == [["draft_head", "mlp", "r8"], ["draft_head", "lowrank", "r8"],
                                      ["draft_head", "linear", "r0"]]
    for r in rows:
        assert r[4:6] == ["36x128,", "4"] and float(r[6]) > 0 and float(r[8]) == 0.3


def test_learned_case_runs_the_plugin_on_a_target(make_target):
    target = make_target("gpt_oss")
    step = bench.learned_case(target, torch.device("cpu"))
    shape = (target.num_moe_layers, target.num_experts, target.top_k, target.hidden_size, target.hidden_size,
             target.vocab_size)
    tree = bench._pool(1, target.vocab_size, torch.Generator().manual_seed(0), "cpu")
    assert tree.num_nodes == 11
    for _ in range(3):
        sets = step(tree)
    assert sets.shape == (1, 11, shape[0], shape[1]) and bool((sets.sum(-1) == target.top_k).all())
    head = bench.head_case(shape, "mlp", 8, torch.device("cpu"), 0)
    head(tree)
