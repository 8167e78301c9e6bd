# SPDX-License-Identifier: Apache-2.0
"""Intervals, verdicts and the cross-fitted best fixed γ (:mod:`specmoe.evaluation.stats`) on synthetic,
seeded timings with a known truth."""

from __future__ import annotations

import numpy as np
import pytest

from specmoe.evaluation.stats import (
    Interval,
    batches_for_margin,
    cross_fit_best,
    cross_fit_ratio,
    expanded_level,
    ratio_intervals,
    verdict,
)

TRUE_RATIO = 1.05


def paired_timings(rng: np.random.Generator, sims: int, n: int, ratio: float, rounds: int = 2):
    """tokens/s of a method and of AR on the same ``n`` prompt batches, ``sims`` times: the batches differ in
    length and difficulty (shared by both methods: what pairing removes), every round has 5 % noise and one
    round in ten is slowed (another tenant), and the fastest of ``rounds`` rounds counts (``eval.repeats``).
    The method is ``ratio`` times as fast as AR on every batch, so the true ratio of mean tokens/s is
    ``ratio`` (both methods' noise has the same distribution)."""
    tokens = rng.integers(60, 200, size=(sims, n)).astype(float)
    difficulty = rng.lognormal(0.0, 0.3, size=(sims, n))

    def tokens_per_s(cost: float) -> np.ndarray:
        t = (tokens * difficulty * cost / 100.0)[..., None] * rng.lognormal(0.0, 0.05, size=(sims, n, rounds))
        slow = rng.random((sims, n, rounds)) < 0.1
        t = t * np.where(slow, 1.0 + rng.exponential(0.3, size=(sims, n, rounds)), 1.0)
        return tokens / t.min(-1)

    return tokens_per_s(1.0 / ratio), tokens_per_s(1.0)


def test_intervals_cover_the_true_ratio_and_pairing_narrows_them():
    rng = np.random.default_rng(2025)
    method, ar = paired_timings(rng, 1000, 16, TRUE_RATIO)
    lo, hi = ratio_intervals(method, ar, seed=1, resamples=2000)  # 1,000 simulations in one vectorised call
    covered = np.mean((lo <= TRUE_RATIO) & (TRUE_RATIO <= hi))
    assert 0.93 <= covered <= 0.97, covered
    ulo, uhi = ratio_intervals(method[:200], ar[:200], seed=1, resamples=2000, paired=False)
    paired_width, unpaired_width = (hi - lo)[:200], uhi - ulo
    assert np.median(paired_width) < 0.5 * np.median(unpaired_width)
    assert np.mean(paired_width < unpaired_width) > 0.95


def test_one_draw_for_every_row_of_a_group():
    """The rows of one call are resampled with the same batch indices (a paired design across methods): two
    identical rows get identical intervals, and a row that is another row times a constant gets that
    constant times its bounds."""
    rng = np.random.default_rng(0)
    x, y = rng.lognormal(size=(1, 12)), rng.lognormal(size=(1, 12))
    lo, hi = ratio_intervals(np.concatenate([x, x, 3 * x]), np.concatenate([y, y, y]), seed=4)
    assert lo[0] == lo[1] and hi[0] == hi[1]
    assert lo[2] == pytest.approx(3 * lo[0]) and hi[2] == pytest.approx(3 * hi[0])
    assert lo[0] < x.sum() / y.sum() < hi[0]


def test_too_few_batches_and_degenerate_rows():
    lo, hi = ratio_intervals(np.ones((2, 4)), np.ones((2, 4)))
    assert np.isnan(lo).all() and np.isnan(hi).all()  # 4 batches < MIN_BATCHES
    lo, hi = ratio_intervals(np.full(8, 2.0), np.ones(8))
    assert float(lo) == float(hi) == 2.0
    assert expanded_level(0.95, 8) > expanded_level(0.95, 64) > 0.95


def test_verdicts_and_prompts_for_a_margin():
    assert verdict(1.01, 1.07) == "faster" and verdict(0.90, 0.99) == "slower"
    assert verdict(0.98, 1.03) == "not resolved" and verdict(None, None) == "not resolved"
    assert verdict(1.01, 1.07, baseline=1.05) == "not resolved"
    iv = Interval(1.03, 0.99, 1.07, n=8)
    assert iv.format() == "1.03x [0.99, 1.07]" and Interval(1.03).format() == "1.03x"
    assert iv.verdict() == "not resolved"
    # half-width 0.25 at 8 batches: a margin of 0.125 needs 4x the batches (1/sqrt(n))
    assert batches_for_margin(0.75, 1.25, 8, 0.125) == 32
    assert batches_for_margin(0.75, 1.25, 8, 0.5) == 8
    assert batches_for_margin(None, None, 8, 0.02) is None


def test_prompts_for_a_margin_follow_the_observed_spread():
    """The estimated batch count resolves the margin when measured: at the estimated size, the intervals'
    median half-width is within 15 % of the margin."""
    rng = np.random.default_rng(7)
    method, ar = paired_timings(rng, 1, 8, TRUE_RATIO)
    lo, hi = ratio_intervals(method, ar, seed=3)
    need = batches_for_margin(float(lo[0]), float(hi[0]), 8, 0.02)
    assert need > 8
    method, ar = paired_timings(rng, 300, need, TRUE_RATIO)
    lo, hi = ratio_intervals(method, ar, seed=3, resamples=1000)
    assert np.median((hi - lo) / 2) == pytest.approx(0.02, rel=0.35)


def test_cross_fitted_best_fixed_gamma_is_unbiased():
    """Seven fixed-γ methods of the same true speed as AR (two datasets, 16 batches each): the in-sample
    maximum is biased upwards, the cross-fitted choice is not (mean within ±1 % of the truth)."""
    rng = np.random.default_rng(11)
    sims, m, n = 300, 7, 16
    in_sample, crossed = [], []
    for _ in range(sims):
        fixed, ar = [], []
        for _ds in range(2):
            base = rng.integers(60, 200, size=n) / rng.lognormal(0.0, 0.3, size=n)
            ar.append(base * rng.lognormal(0.0, 0.08, size=n))
            fixed.append(base * rng.lognormal(0.0, 0.08, size=(m, n)))
        out = cross_fit_best(fixed, ar, splits=10, seed=int(rng.integers(1 << 30)))
        in_sample.append(out["in_sample"])
        crossed.append(out["cross_fitted"])
        assert sum(out["chosen"]) == 20
    assert np.mean(in_sample) > 1.02
    assert abs(np.mean(crossed) - 1.0) < 0.01
    assert cross_fit_best([np.ones((2, 1))], [np.ones(1)]) is None  # one batch: no held-out fold


def test_prompts_grow_until_the_margin_is_resolved_or_the_cap(make_target, tmp_path):
    """``eval.prompts_for_margin`` in a real group (tiny target, AR + a draft-model method): a margin every
    interval meets stops at the first size with an interval (MIN_BATCHES batches), one no interval meets
    grows to ``max_prompts``; the prompts added are the dataset's next ones, none twice; no margin measures
    the listed prompts only."""
    from specmoe.config.schema import Component, MethodConfig
    from specmoe.decoding.settings import DecodeSettings
    from specmoe.decoding.stopping import StopRule
    from specmoe.evaluation.group import EvalGroup, Member
    from specmoe.evaluation.method import Method
    from specmoe.evaluation.stats import MIN_BATCHES
    from specmoe.interfaces.dataset import Sample

    target = make_target("qwen3_moe")
    ar = Method(MethodConfig(name="ar"), target, lambda x: x)
    sd = Method(MethodConfig(name="sd", drafter=Component("draft_model", {"share_target": True}, "drafter"),
                             selector=Component("confidence", {}, "selector")), target, lambda x: x)
    members = [Member("ar", 1, lambda: ar, autoregressive=True), Member("sd", 3, lambda: sd)]
    pool = [Sample(str(i), ["q"]) for i in range(12)]

    def group(name: str, margin: float | None, cap: int) -> list:
        g = EvalGroup(tmp_path / name, members, [pool[3], pool[0]], dataset="d", temperature=0.0, batch_size=1,
                      render=lambda s, turn, prev: [3 + int(s.id), 5, 7, 11], decode=str,
                      decoding=DecodeSettings(1, 2, 2, 0.0, StopRule(4)), warmup=0, seed=0,
                      target_facts={"bytes_per_expert": 1, "bytes_per_expert_loaded": 1, "num_moe_layers": 1},
                      margin=margin, max_prompts=cap, more=lambda: pool)
        return g.run()

    wide = {c.method: c for c in group("wide", 1000.0, 12)}
    assert wide["ar"].prompt_batches == wide["sd"].prompt_batches == MIN_BATCHES
    assert "speedup" in wide["sd"].intervals
    assert [s["id"] for s in wide["sd"].per_sample] == ["3", "0", "1", "2", "4"]
    narrow = {c.method: c for c in group("narrow", 1e-9, 9)}
    assert narrow["sd"].prompt_batches == 9 and len({s["id"] for s in narrow["sd"].per_sample}) == 9
    assert {c.prompt_batches for c in group("listed", None, 0)} == {2}
    assert {c.prompt_batches for c in group("narrow", 1e-9, 9)} == {9}  # read back from the cache


def test_ratio_to_the_cross_fitted_best_has_a_conservative_interval():
    """An adaptive method as fast as seven fixed-γ methods and AR: the interval of its ratio to the cross-fitted
    best holds 1 (it redoes the choice in every resample, so it errs wide); one 25 % faster is resolved
    faster."""
    rng = np.random.default_rng(3)

    def draw(speed: float):
        method, fixed, ar = [], [], []
        for _ds in range(2):
            base = rng.integers(60, 200, size=16) / rng.lognormal(0.0, 0.3, size=16)
            ar.append(base * rng.lognormal(0.0, 0.08, size=16))
            fixed.append(base * rng.lognormal(0.0, 0.08, size=(7, 16)))
            method.append(speed * base * rng.lognormal(0.0, 0.08, size=16))
        return cross_fit_ratio(method, fixed, ar, splits=10, resamples=1000, seed=int(rng.integers(1 << 30)))

    same = [draw(1.0) for _ in range(100)]
    assert np.mean([iv.lo <= 1.0 <= iv.hi for iv in same]) >= 0.95
    assert abs(np.mean([iv.value for iv in same]) - 1.0) < 0.01
    faster = [draw(1.25) for _ in range(20)]
    assert np.mean([iv.verdict() == "faster" for iv in faster]) >= 0.9
    assert cross_fit_ratio([np.ones(1)], [np.ones((2, 1))], [np.ones(1)]) is None
