# SPDX-License-Identifier: Apache-2.0
"""``platform bench selector``: one row per (case, selector) with the ratio to the target; selectors by import
path and ``--set`` options; bad names are one clear error."""

from __future__ import annotations

import argparse

import pytest

from specmoe.errors import UserError
from specmoe_plugins.benches import selector as bench


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_prints_every_case_and_selector(capsys):
    sels = "ecospec,goodput,global_cost,confidence,fixtures.reference_selection:EcoSpecReference"
    rc = bench.run(_args("--selectors", sels, "--layers", "4", "--experts", "16", "--top-k", "2", "--trees", "1",
                         "--repeats", "1"))
    assert rc == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] and
            line.split()[0] in bench.CASES]
    assert [(r[0], r[1]) for r in rows] == [(c, s) for c in bench.CASES for s in
                                            ("ecospec", "goodput", "global_cost", "confidence", "EcoSpecReference")]
    for r in rows:
        med, target, ratio = float(r[2]), float(r[4]), float(r[5].rstrip("x"))
        assert med > 0 and ratio == pytest.approx(med / target, abs=0.01)


def test_random_cases_have_the_announced_shapes():
    tree, ex = bench.random_case(8, 60, 3, 16, 2, seed=0)
    assert tree.tokens.shape == (8, 61) and ex.shape == (8, 61, 3, 16)
    assert (ex.sum(-1) == 2).all()
    tree, _ = bench.random_case(1, 10, 3, 16, 2, seed=0)
    assert tree.num_nodes == 11 and tree.depth.max() == 3  # EAGLE's pool: 3 steps x top-2


def test_options_and_bad_input():
    sels = bench.build_selectors(["goodput", "ecospec"], ["goodput.gamma_max=3", "ecospec.shared_buffer=false"])
    assert sels["goodput"].config.gamma_max == 3 and sels["ecospec"].config.shared_buffer is False
    with pytest.raises(UserError, match="not registered"):
        bench.build_selectors(["nope"])
    with pytest.raises(UserError, match="SELECTOR.KEY=VALUE"):
        bench.build_selectors(["goodput"], ["gamma_max=3"])
    with pytest.raises(UserError, match="bad option"):
        bench.build_selectors(["goodput"], ["goodput.colour=red"])


def test_cold_calls_are_announced_and_timed(capsys):
    rc = bench.run(_args("--selectors", "ecospec", "--cases", "pool10_g4_bs1", "--layers", "4", "--experts", "16",
                         "--top-k", "2", "--trees", "1", "--repeats", "2", "--flush-mb", "1"))
    out = capsys.readouterr().out
    assert rc == 0 and "caches flushed (1 MB written) before each call" in out
    assert float(next(ln for ln in out.splitlines() if ln.startswith("pool10_g4_bs1")).split()[2]) > 0
