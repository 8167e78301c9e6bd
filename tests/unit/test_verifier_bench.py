# SPDX-License-Identifier: Apache-2.0
"""``platform bench verifier`` on CPU: the tiny sweep runs and prints one row per (model, T, union size)."""

from __future__ import annotations

import argparse

import pytest
import torch

from specmoe.bench import verifier as bench


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cpu_sweep_prints_expected_rows(capsys):
    torch.set_num_threads(1)
    rc = bench.run(_args("--cpu", "--gammas", "1,4", "--iters", "1", "--warmup", "0"))
    assert rc == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["model", "T"])
    assert {"hf_grouped_mm", "hf_eager", "torch_union"} <= set(lines[header].split())
    rows = [line.split() for line in lines[header + 1:] if line.split() and line.split()[0] in bench.MODELS]
    # gamma 1: |U| = k only; gamma 4: min (k), mid, max (min(E, 4k)) are distinct sizes -> 3 rows
    got = [(r[0], int(r[1]), r[2], int(r[3])) for r in rows]
    assert got == [("gpt_oss_120b", 1, "min", 4), ("gpt_oss_120b", 4, "min", 4),
                   ("gpt_oss_120b", 4, "mid", 10), ("gpt_oss_120b", 4, "max", 16),
                   ("qwen3_235b", 1, "min", 8), ("qwen3_235b", 4, "min", 8),
                   ("qwen3_235b", 4, "mid", 12), ("qwen3_235b", 4, "max", 16)]
    assert "max relative difference vs hf_grouped_mm" in out
    diff = float(out.split("max relative difference vs hf_grouped_mm: ")[1].split()[0])
    assert diff < 1e-5
    if not torch.cuda.is_available():
        assert "skipping the GPU sweep" in out


def test_union_routing_controls_the_union_size():
    gen = torch.Generator().manual_seed(0)
    for t, k, e, u in [(1, 4, 128, 4), (8, 4, 128, 20), (8, 8, 128, 64), (64, 8, 128, 128), (6, 4, 16, 16)]:
        idx = bench.union_routing(t, k, e, u, gen)
        assert idx.shape == (t, k)
        assert all(row.unique().numel() == k for row in idx)
        assert idx.unique().numel() == min(u, t * k, e)


def test_unknown_model_is_a_user_error():
    from specmoe.errors import UserError

    with pytest.raises(UserError, match="--models"):
        bench.run(_args("--cpu", "--models", "llama"))
