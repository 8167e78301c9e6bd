# SPDX-License-Identifier: Apache-2.0
"""``platform bench peer``'s headroom of a per-step draft count: the replay of a fixed chain's steps, the step
cost's line, the oracle and the last-step rule (pure Python), and its path from the vLLM runner's rows to the
report."""

from __future__ import annotations

import argparse
import random

import pytest

from specmoe_plugins.peers.vllm import bench as peer
from specmoe_plugins.peers.vllm import headroom as H


def test_the_step_cost_is_the_line_through_the_fixed_chains():
    c0, c1 = 6e-3, 1.5e-3
    chains = {k: ((c0 + c1 * k) * 200, 200) for k in (1, 2, 3, 5)}
    got = H.fit_step_cost(chains)
    assert got == pytest.approx((c0, c1))
    assert H.fit_step_cost({3: (1.0, 100)}) is None  # one length: no slope
    assert H.fit_step_cost({1: (2.0, 100), 2: (1.0, 100)}) is None  # longer chains cheaper: not a cost line


def test_the_replay_commits_the_accepted_prefix_and_prices_what_it_verified():
    accepted, drafted = [[3, 0, 1]], [[3, 3, 2]]
    seen = []
    tokens, seconds = H.replay(accepted, drafted, lambda state: 2, (1.0, 0.5), seen)
    # k = 2, 2, 2 (capped at the 2 drafted): min(a, k) + 1 = 3, 1, 2
    assert tokens == 6 and seconds == pytest.approx(3 * (1.0 + 0.5 * 2))
    # the states the rule met: first step, all 2 accepted, the first draft rejected
    assert [s for s, _, _ in seen] == [None, ("all",), ("rej", 0)]


def _persistent(n: int, k: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Requests whose draft is either always right or always wrong at the first position."""
    rng = random.Random(seed)
    acc = [[k] * 20 if rng.random() < 0.5 else [0] * 20 for _ in range(n)]
    return acc, [[k] * 20 for _ in range(n)]


def _iid(n: int, k: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Every step's accepted count drawn alike (geometric-like, no memory)."""
    rng = random.Random(seed)
    def one() -> int:
        a = 0
        while a < k and rng.random() < 0.7:
            a += 1
        return a
    return [[one() for _ in range(20)] for _ in range(n)], [[k] * 20 for _ in range(n)]


def test_the_last_step_rule_finds_memory_and_finds_none_where_there_is_none():
    cost = (6e-3, 1.5e-3)
    h = H.headroom(*_persistent(32, 5, 0), cost)
    # half the requests never accept: after a rejection at 0 the rule verifies one draft, the fixed count five
    assert h["history_lo"] > 1.1 and h["oracle"] >= h["history"]
    h = H.headroom(*_iid(32, 5, 1), cost)
    assert h["history_hi"] < 1.03 and abs(h["history"] - 1) < 0.015 and h["oracle"] > 1.1
    assert H.headroom([[1]] * 3, [[2]] * 3, cost) is None  # too few requests to halve


def _runner_out(accepted: list[list[int]], c0: float, c1: float) -> dict:
    """vLLM runner output of no speculation and fixed chains 1..3 at b1 T0, each timed by the cost line on the
    chain of 3's accepted counts (capped per chain)."""
    runs = [{"num_speculative_tokens": 0, "startup_s": 1.0, "cells": [
        {"batch": 1, "temperature": 0.0, "tokens_per_s": 100.0, "tokens": 4, "outputs": [[1] * 2] * 2,
         "seconds": [0.02, 0.02]}]}]
    for k in (1, 2, 3):
        steps = [[min(a, k) for a in acc] for acc in accepted]
        tokens = sum(a + 1 for s in steps for a in s)
        n = sum(len(s) for s in steps)
        secs = n * (c0 + c1 * k)
        runs.append({"num_speculative_tokens": k, "startup_s": 1.0, "cells": [
            {"batch": 1, "temperature": 0.0, "tokens_per_s": tokens / secs, "tokens": tokens,
             "outputs": [[1] * 2] * len(accepted), "seconds": [secs / len(accepted)] * len(accepted), "drafts": n,
             "per_step_accepted": steps, "per_step_drafted": [[k] * len(s) for s in steps]}]})
    return {"runs": runs}


def test_a_pass_of_fixed_chains_gives_the_cells_headroom_and_the_report_shows_it():
    accepted, _ = _persistent(16, 3, 2)
    rows = peer._vllm_rows(_runner_out(accepted, 6e-3, 1.5e-3))
    assert "steps" in rows["vllm/eagle3_chain3"] and "steps" not in rows["vllm/no_spec"]
    h = peer.pass_headroom(rows)
    assert h["step_cost_s"] == pytest.approx([6e-3, 1.5e-3])
    # the chains were timed by the same line on the same steps: the replay matches each of them
    assert h["replay_vs_measured"] == {"1": 1.0, "2": 1.0, "3": 1.0}
    assert h["history"] > 1.1
    one_chain = {n: r for n, r in rows.items() if not n.endswith(("chain1", "chain2"))}
    assert peer.pass_headroom(one_chain) is None  # one chain length: no cost line
    r = {"vllm": {"vllm_version": "0.32.0", "torch_version": "2.13.0"}, "target": "t", "drafter_path": "d",
         "dtype": "float32", "prompts": 16, "new_tokens": 8, "threads": 1, "passes": 1, "cpu": "cpu",
         "torch_version": "2.13.0", "rows": {}, "agreement_reference": None, "headroom": [h]}
    text = peer._report(r, argparse.Namespace(dataset="gsm8k", batches="1", temperatures="0"))
    assert "headroom of a per-step draft count at b1 T0" in text and f"oracle {h['oracle']:.3f}x" in text
    # the prompts' source as the bench resolved it (the registry's default dataset when none was named)
    from specmoe.registry import datasets

    text = peer._report(r, argparse.Namespace(dataset=None, batches="1", temperatures="0"))
    assert f"{datasets.default()} x 16 prompts" in text and "None x" not in text
