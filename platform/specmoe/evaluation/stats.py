# SPDX-License-Identifier: Apache-2.0
"""Confidence intervals, verdicts, prompt counts and an honest "best fixed γ" for evaluation ratios.

Every reported number is a ratio of sums over a cell's prompt batches (tokens/s, speedup Σ tps_A / Σ tps_B,
α Σ accepted / Σ rows, per-step means weighted by steps). Batches are resampled jointly for a whole group
(paired bootstrap), rounds not (a batch's value is its fastest round). Intervals are percentile intervals at
Hesterberg's (2015) expanded level ``2 Φ(√(n/(n-1)) t_{n-1, (1+level)/2}) - 1``; none below :data:`MIN_BATCHES`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["LEVEL", "RESAMPLES", "MIN_BATCHES", "Interval", "expanded_level", "ratio_of_sums",
           "ratio_intervals", "verdict", "batches_for_margin", "cross_fit_best", "VERDICTS", "add_intervals",
           "batch_arrays", "pair_interval", "cross_fit_ratio"]

#: the confidence level of every interval the platform reports
LEVEL = 0.95
#: bootstrap resamples per interval
RESAMPLES = 4000
#: fewer prompt batches than this give no interval (too few to estimate a spread)
MIN_BATCHES = 5
FASTER, SLOWER, UNRESOLVED = "faster", "slower", "not resolved"
VERDICTS = (FASTER, SLOWER, UNRESOLVED)


@dataclass(frozen=True)
class Interval:
    """A point estimate with its confidence interval (``lo`` / ``hi`` None: too few batches)."""

    value: float
    lo: Optional[float] = None
    hi: Optional[float] = None
    n: int = 0
    """prompt batches the interval comes from."""
    level: float = LEVEL

    @property
    def resolved(self) -> bool:
        return self.lo is not None and self.hi is not None

    def verdict(self, baseline: float = 1.0) -> str:
        return verdict(self.lo, self.hi, baseline)

    def format(self, fmt: str = "{:.2f}", suffix: str = "x") -> str:
        """``1.03x [0.99, 1.07]`` (the point alone when there is no interval)."""
        point = fmt.format(self.value) + suffix
        if not self.resolved:
            return point
        return f"{point} [{fmt.format(self.lo)}, {fmt.format(self.hi)}]"


def expanded_level(level: float, n: int) -> float:
    """Hesterberg's expanded percentile level for a ``level`` interval from ``n`` observations."""
    from scipy import stats

    if n < 2:
        return level
    t = stats.t.ppf((1 + level) / 2, n - 1) * math.sqrt(n / (n - 1))
    return float(2 * stats.norm.cdf(t) - 1)


def ratio_of_sums(x: npt.ArrayLike, y: npt.ArrayLike, axis: int = -1) -> np.ndarray | np.floating:
    """Σ x / Σ y along ``axis`` (the statistic of every interval here; vectorised)."""
    return np.sum(x, axis=axis) / np.sum(y, axis=axis)


def ratio_intervals(x: npt.ArrayLike, y: npt.ArrayLike, *, level: float = LEVEL, resamples: int = RESAMPLES,
                    seed: int = 0, paired: bool = True,
                    min_batches: int = MIN_BATCHES) -> tuple[np.ndarray, np.ndarray]:
    """Intervals of Σ x / Σ y for every row of ``x`` / ``y`` (shape ``[..., n]``, last axis the prompt batches);
    ``paired``: one resampling of the batch indices for *all* rows, else x and y independently (comparison only).

    Returns:
        ``(lo, hi)`` of the rows' shape; NaN below ``min_batches`` batches or where a resample has Σ y = 0. A
        row whose resamples all agree gets a zero-width interval at its value.
    """
    from scipy import stats

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    x, y = np.broadcast_arrays(x, y)
    n = x.shape[-1]
    nan = np.full(x.shape[:-1], np.nan)
    if n < max(min_batches, 2) or x.size == 0:
        return nan, nan.copy()
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore")  # degenerate rows (all resamples equal) are handled below
        res = stats.bootstrap((x, y), ratio_of_sums, paired=paired, vectorized=True, axis=-1,
                              n_resamples=resamples, method="percentile",
                              confidence_level=expanded_level(level, n), rng=np.random.default_rng(seed),
                              batch=max(1, min(resamples, int(2e7 // max(x.size, 1)))))
        lo = np.asarray(res.confidence_interval.low, dtype=float)
        hi = np.asarray(res.confidence_interval.high, dtype=float)
        dist = np.asarray(res.bootstrap_distribution, dtype=float)
        flat = np.nanmax(dist, axis=-1) == np.nanmin(dist, axis=-1)
        point = ratio_of_sums(x, y)
        bad = ~np.isfinite(dist).all(axis=-1)
    lo, hi = np.where(flat, point, lo), np.where(flat, point, hi)
    lo, hi = np.where(bad, np.nan, lo), np.where(bad, np.nan, hi)
    return lo.reshape(nan.shape), hi.reshape(nan.shape)


def verdict(lo: Optional[float], hi: Optional[float], baseline: float = 1.0) -> str:
    """``faster`` when the whole interval is above ``baseline``, ``slower`` when below, else
    ``not resolved`` (also without an interval)."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return UNRESOLVED
    if lo > baseline:
        return FASTER
    if hi < baseline:
        return SLOWER
    return UNRESOLVED


def batches_for_margin(lo: Optional[float], hi: Optional[float], n: int, margin: float) -> Optional[int]:
    """Prompt batches that shrink the interval's half-width to ``margin`` (ratio units), the observed spread
    shrinking as 1/√n; ``None`` without an interval."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)) or margin <= 0 or n < 1:
        return None
    half = (hi - lo) / 2
    return max(n, math.ceil(n * (half / margin) ** 2 - 1e-9)) if half > 0 else n


def cross_fit_best(fixed: Sequence[Any], ar: Sequence[Any], *, folds: int = 2, splits: int = 50,
                   seed: int = 0) -> Optional[dict[str, Any]]:
    """The speedup a user who picked the best fixed γ on some prompts gets on new ones (cross-fitting).

    Args:
        fixed: per dataset, ``[M, n_d]`` tokens/s of the M fixed-γ members (same members and order everywhere).
        ar: per dataset, ``[n_d]`` tokens/s of AR on the same batches.
        folds, splits: ``splits`` seeded random splits of each dataset's batches into ``folds``; the member with
            the best mean speedup on the other folds is scored on the held-out fold.

    Returns:
        ``{"cross_fitted": mean held-out speedup, "in_sample": the highest speedup on all batches (biased
        upwards), "in_sample_index": that member, "chosen": times each member was chosen}``; ``None`` when a
        dataset has fewer batches than folds.
    """
    fixed = [np.asarray(f, dtype=float) for f in fixed]
    ar = [np.asarray(a, dtype=float) for a in ar]
    if not fixed or any(a.shape[-1] < folds for a in ar) or folds < 2:
        return None
    m = fixed[0].shape[0]
    full = np.mean([f.sum(-1) / a.sum() for f, a in zip(fixed, ar)], axis=0)
    rng = np.random.default_rng(seed)
    held, chosen = [], np.zeros(m, dtype=int)
    for _ in range(splits):
        assign = [rng.permutation(a.shape[-1]) % folds for a in ar]
        for k in range(folds):
            train = np.mean([f[:, g != k].sum(-1) / a[g != k].sum() for f, a, g in zip(fixed, ar, assign)], axis=0)
            best = int(np.argmax(train))
            chosen[best] += 1
            held.append(np.mean([f[best, g == k].sum() / a[g == k].sum() for f, a, g in zip(fixed, ar, assign)]))
    return {"cross_fitted": float(np.mean(held)), "in_sample": float(full.max()),
            "in_sample_index": int(np.argmax(full)), "chosen": chosen.tolist()}


def batch_arrays(cell: Any, metric: str) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """``(weight · value, weight)`` per prompt batch of ``cell`` for ``metric`` (``None`` unless all have it)."""
    vals = [b.get("values", {}).get(metric) for b in cell.batches]
    if not vals or any(v is None for v in vals):
        return None
    v, w = np.array(vals, dtype=float).T
    return v * w, w


def add_intervals(cells: Sequence[Any], *, seed: int = 0, level: float = LEVEL,
                  resamples: int = RESAMPLES) -> None:
    """Fill ``cell.intervals`` of every cell of one group: speedup over the group's AR cell and each metric
    with per-batch values, all from one paired resampling of the group's prompt batches."""
    ar = next((c for c in cells if c.autoregressive), None)
    rows: list[tuple[Any, str, np.ndarray, np.ndarray]] = []
    ar_tps = batch_arrays(ar, "tokens_per_s") if ar is not None else None
    for c in cells:
        for name in c.batches[0].get("values", {}) if c.batches else ():
            got = batch_arrays(c, name)
            if got is not None and name in c.metrics:
                rows.append((c, name, *got))
        tps = batch_arrays(c, "tokens_per_s")
        if not c.autoregressive and ar_tps is not None and tps is not None and "speedup" in c.metrics \
                and len(tps[0]) == len(ar_tps[0]):
            rows.append((c, "speedup", tps[0], ar_tps[0]))
    by_n: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_n.setdefault(len(r[2]), []).append(i)
    for idx in by_n.values():
        lo, hi = ratio_intervals(np.stack([rows[i][2] for i in idx]), np.stack([rows[i][3] for i in idx]),
                                 level=level, resamples=resamples, seed=seed)
        for i, a, b in zip(idx, lo, hi):
            if np.isfinite(a) and np.isfinite(b):
                rows[i][0].intervals[rows[i][1]] = [float(a), float(b)]


def pair_interval(a: Any, b: Any, *, seed: int = 0, level: float = LEVEL,
                  resamples: int = RESAMPLES) -> Optional[Interval]:
    """Method ``a`` over method ``b`` (tokens/s, paired over their common prompt batches: cells of the same
    group); ``None`` when their batches are not recorded or do not match."""
    x, y = batch_arrays(a, "tokens_per_s"), batch_arrays(b, "tokens_per_s")
    if x is None or y is None or len(x[0]) != len(y[0]) or a.key != b.key:
        return None
    lo, hi = ratio_intervals(x[0], y[0], level=level, resamples=resamples, seed=seed)
    ok = bool(np.isfinite(lo) and np.isfinite(hi))
    return Interval(float(x[0].sum() / y[0].sum()), float(lo) if ok else None, float(hi) if ok else None,
                    n=len(x[0]), level=level)


def cross_fit_ratio(method: Sequence[Any], fixed: Sequence[Any], ar: Sequence[Any], *, folds: int = 2,
                    splits: int = 50, level: float = LEVEL, resamples: int = 2000, seed: int = 0,
                    min_batches: int = MIN_BATCHES) -> Optional[Interval]:
    """``method``'s speedup (mean over datasets) over the cross-fitted best fixed γ, with an interval from a
    joint resampling of every dataset's batches that redoes the selection on one random split each (errs wide).

    Args:
        method: per dataset, ``[n_d]`` tokens/s of the (adaptive) method on the dataset's batches.
        fixed, ar: as in :func:`cross_fit_best` (the same batches).

    ``None`` when a dataset has fewer batches than folds; no interval below ``min_batches``.
    """
    method = [np.asarray(x, dtype=float) for x in method]
    fixed = [np.asarray(f, dtype=float) for f in fixed]
    ar = [np.asarray(a, dtype=float) for a in ar]
    best = cross_fit_best(fixed, ar, folds=folds, splits=splits, seed=seed)
    if best is None or not best["cross_fitted"]:
        return None
    value = float(np.mean([x.sum() / a.sum() for x, a in zip(method, ar)]) / best["cross_fitted"])
    n = min(a.shape[-1] for a in ar)
    if n < max(min_batches, folds):
        return Interval(value, n=n, level=level)
    rng = np.random.default_rng(seed)
    held, rows = np.zeros(resamples), np.arange(resamples)
    # per dataset: resampled batches and a split of the *original* batches (a batch's copies share one fold)
    draws = []
    for a in ar:
        n_d = a.shape[-1]
        split = rng.random((resamples, n_d)).argsort(axis=-1).argsort(axis=-1) % folds
        idx = rng.integers(0, n_d, size=(resamples, n_d))
        draws.append((idx, np.take_along_axis(split, idx, axis=-1)))
    num = np.zeros(resamples)
    for (idx, _), x, a in zip(draws, method, ar):
        num += x[idx].sum(-1) / a[idx].sum(-1) / len(ar)
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in range(folds):
            train, parts = np.zeros((fixed[0].shape[0], resamples)), []
            for (idx, split), f, a in zip(draws, fixed, ar):
                fold = split == k
                fs, rs = f[:, idx], a[idx]  # [M, B, n], [B, n]
                train += np.where(~fold, fs, 0).sum(-1) / np.where(~fold, rs, 0).sum(-1) / len(ar)
                parts.append((fs, rs, fold))
            choice = np.argmax(np.nan_to_num(train, nan=-np.inf), axis=0)
            for fs, rs, fold in parts:
                held += np.where(fold, fs[choice, rows], 0).sum(-1) / np.where(fold, rs, 0).sum(-1) / len(ar) / folds
    ratio = num / held
    ratio = ratio[np.isfinite(ratio)]
    if ratio.size < resamples // 2:
        return Interval(value, n=n, level=level)
    q = expanded_level(level, n)
    lo, hi = np.quantile(ratio, [(1 - q) / 2, (1 + q) / 2])
    return Interval(value, float(lo), float(hi), n=n, level=level)
