# SPDX-License-Identifier: Apache-2.0
"""Step cost model: the seconds of a verification pass from its shape, plus drafting, prediction and selection.

``T_verify = sum_j c_j * x_j(shape)`` over named features (:data:`FEATURES`): a fixed term, verified tokens,
expert-layers (the sum over MoE layers of the unique experts the pass touches: the expert weights it must read),
cached KV slots (what attention reads), and optional padded-token and token x context terms. Coefficients are
seconds per unit, never negative. They come from an offline calibration (``platform bench goodput_cost``,
forced routing at controlled unions, :mod:`.calibration`; JSON beside the target or in a stage cache) and/or online
from a sliding window of observed steps: relative-error Huber regression (IRLS) with a ridge pull towards the
prior coefficients, so terms a window cannot separate (e.g. the fixed and per-token terms when every step
verifies the same number of tokens) are split as the prior suggests instead of arbitrarily.

``T_draft``, ``T_pred`` and ``T_select`` come from sliding windows of observed steps, per batch size: the median,
or, for a step whose drafter (and predictor) first absorb ``absorbed`` committed tokens per row, ``a + b *
absorbed`` fitted on the window (the first step of a generation absorbs the prompt, the first after a stretch
of AR steps absorbs all their tokens; a speculative stretch absorbs only the last step's accepted tokens, so
its draft is several times cheaper than such a catch-up step's).
"""

from __future__ import annotations

import json
import statistics
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from scipy.stats import theilslopes

__all__ = ["FEATURES", "DEFAULT_FEATURES", "VerifyShape", "CostModel", "huber_fit", "relative_errors"]

#: feature name -> meaning (per verification pass)
FEATURES: dict[str, str] = {
    "fixed": "1",
    "tokens": "verified tokens over all rows (roots included)",
    "padded_tokens": "rows x the longest row's verified tokens (what a padded batch computes)",
    "expert_layers": "sum over MoE layers of the unique experts of the pass",
    "kv_slots": "rows x cached KV slots per row",
    "token_kv": "verified tokens x cached KV slots per row",
}
DEFAULT_FEATURES = ("fixed", "tokens", "expert_layers", "kv_slots")
_FORMAT = "specmoe.cost_model/1"


@dataclass(frozen=True)
class VerifyShape:
    """What a verification pass processes.

    Attributes:
        tokens: verified tokens over all rows (roots included).
        expert_layers: sum over MoE layers of unique experts (union over the batch).
        rows: batch rows in the pass.
        width: the longest row's token count (0: ``ceil(tokens / rows)``).
        kv_slots: cached KV slots per row before the pass.
    """

    tokens: int
    expert_layers: float
    rows: int = 1
    width: int = 0
    kv_slots: int = 0

    def features(self, names: Sequence[str]) -> np.ndarray:
        width = self.width or -(-self.tokens // max(self.rows, 1))
        val = {"fixed": 1.0, "tokens": self.tokens, "padded_tokens": self.rows * width,
               "expert_layers": self.expert_layers, "kv_slots": self.rows * self.kv_slots,
               "token_kv": self.tokens * self.kv_slots}
        return np.array([val[n] for n in names], dtype=np.float64)


def huber_fit(x: np.ndarray, y: np.ndarray, *, prior: np.ndarray | None = None, prior_weight: float = 0.0,
              delta: float = 1.345, iters: int = 30) -> np.ndarray:
    """Non-negative coefficients ``c`` minimising a Huber loss of the relative residuals ``(x c - y) / y``.

    IRLS with the scale re-estimated by the MAD each iteration; a feature whose coefficient would be negative
    is fixed at 0 and the rest refitted. With ``prior`` and ``prior_weight = w``, a coefficient's deviation
    from its prior costs what ``w`` observations would pay for that deviation of the term alone (at the
    window's median feature, in relative error).

    Args:
        x: ``[M, F]`` features; y: ``[M]`` positive targets (seconds).
    """
    m, f = x.shape
    xr = x / y[:, None]  # relative residuals: (x c - y) / y = xr c - 1
    one = np.ones(m)
    pen_x, pen_y = np.zeros((0, f)), np.zeros(0)
    if prior is not None and prior_weight > 0:
        scale = np.median(np.abs(xr), axis=0) + 1e-12
        pen_x = np.diag(np.sqrt(prior_weight) * scale)
        pen_y = np.sqrt(prior_weight) * scale * prior
    active = np.ones(f, dtype=bool)
    c = np.zeros(f)
    for _ in range(f + 1):
        w = np.ones(m)
        for _ in range(iters):
            a = np.vstack([xr[:, active] * np.sqrt(w)[:, None], pen_x[:, active]])
            b = np.concatenate([one * np.sqrt(w), pen_y])
            sol = np.linalg.lstsq(a, b, rcond=None)[0]
            r = xr[:, active] @ sol - one
            s = 1.4826 * np.median(np.abs(r - np.median(r))) + 1e-9
            w_new = np.minimum(1.0, delta * s / np.maximum(np.abs(r), 1e-12))
            if np.allclose(w_new, w, atol=1e-4):
                break
            w = w_new
        c = np.zeros(f)
        c[active] = sol
        if (c >= 0).all():
            break
        active &= c > 0
        if not active.any():
            break
    return np.clip(c, 0.0, None)


def relative_errors(predicted: Iterable[float], measured: Iterable[float]) -> dict[str, float]:
    """``|predicted - measured| / measured``: median, p90 and count."""
    e = np.abs(np.asarray(list(predicted)) - np.asarray(list(measured))) / np.asarray(list(measured))
    if e.size == 0:
        return {"median_abs_rel_error": float("nan"), "p90_abs_rel_error": float("nan"), "n": 0}
    return {"median_abs_rel_error": float(np.median(e)), "p90_abs_rel_error": float(np.percentile(e, 90)),
            "n": int(e.size)}


class CostModel:
    """Predicts the seconds of each part of a speculative step; refits itself from observed steps.

    Args:
        coef: seconds per unit of each feature (the prior; missing features start at 0).
        features: feature names (:data:`FEATURES`).
        window: observed verification passes kept for the online fit.
        refit_every: refit after this many new observations (once ``min_fit`` are in the window).
        min_fit: observations needed before the first online fit.
        prior_weight: pull of each coefficient towards ``coef`` in online fits, in observations' worth of a
            100 % relative error. Small (the default): it only decides what the window cannot (collinear terms);
            as large as the window: a calibration of the whole shape range keeps the directions the window
            has not explored, and also its level where the window disagrees.
        overheads: initial ``{"t_draft": {rows: s}, "t_pred": ..., "t_select": ...}`` medians.
        meta: free-form provenance (target, device, dtype, layers, experts, top_k, clock, fit errors).
    """

    PARTS = ("t_draft", "t_pred", "t_select")

    def __init__(self, coef: dict[str, float] | None = None, *, features: Sequence[str] = DEFAULT_FEATURES,
                 window: int = 256, refit_every: int = 16, min_fit: int = 24, prior_weight: float = 1e-3,
                 overheads: dict[str, dict[int, float]] | None = None, meta: dict[str, Any] | None = None) -> None:
        unknown = [f for f in features if f not in FEATURES]
        if unknown:
            raise ValueError(f"unknown cost features {unknown}; known: {', '.join(FEATURES)}")
        coef = dict(coef or {})
        bad = [k for k in coef if k not in features]
        if bad:
            raise ValueError(f"coefficients {bad} are not among the features {list(features)}")
        self.features = tuple(features)
        self.prior = np.array([float(coef.get(f, 0.0)) for f in self.features])
        self.coef = self.prior.copy()
        self.window, self.refit_every, self.min_fit, self.prior_weight = window, refit_every, min_fit, prior_weight
        self.meta = dict(meta or {})
        self._obs: deque[tuple[np.ndarray, float]] = deque(maxlen=window)
        self._heldout: deque[tuple[float, float]] = deque(maxlen=window)  # (predicted before seen, measured)
        self._since_fit = 0
        # part -> rows -> (absorbed tokens per row or NaN when unknown, seconds)
        self._parts: dict[str, dict[int, deque[tuple[float, float]]]] = {p: {} for p in self.PARTS}
        self._part_fits: dict[tuple[str, int], np.ndarray | None] = {}  # cached (a, b) of a + b * absorbed
        self._part_medians: dict[tuple[str, int], float] = {}  # cached medians of a part's window
        self._part_new: dict[tuple[str, int], int] = {}  # observations since the cached fit / median
        for part, by_rows in (overheads or {}).items():
            for rows, sec in by_rows.items():
                self._parts[part].setdefault(int(rows), deque(maxlen=window)).append((float("nan"), float(sec)))

    # ---------------------------------------------------------------- verification
    def coefficient(self, name: str) -> float:
        """Seconds per unit of ``name`` (0 for a feature the model does not use)."""
        return float(self.coef[self.features.index(name)]) if name in self.features else 0.0

    def coefficients(self) -> dict[str, float]:
        return {f: float(c) for f, c in zip(self.features, self.coef)}

    def predict_verify(self, shape: VerifyShape) -> float:
        """Seconds of one verification pass of ``shape``."""
        return float(shape.features(self.features) @ self.coef)

    def observe_verify(self, shape: VerifyShape, seconds: float) -> None:
        """Add a measured pass to the window; refits every ``refit_every`` observations."""
        if not seconds > 0:
            return
        x = shape.features(self.features)
        self._heldout.append((float(x @ self.coef), float(seconds)))
        self._obs.append((x, float(seconds)))
        self._since_fit += 1
        if len(self._obs) >= self.min_fit and self._since_fit >= self.refit_every:
            self.refit()

    def refit(self) -> None:
        """Fit the window (prior-regularised relative Huber); no-op on an empty window."""
        self._since_fit = 0
        if not self._obs:
            return
        x = np.stack([o[0] for o in self._obs])
        y = np.array([o[1] for o in self._obs])
        self.coef = huber_fit(x, y, prior=self.prior, prior_weight=self.prior_weight)

    def fit(self, shapes: Sequence[VerifyShape], seconds: Sequence[float]) -> dict[str, float]:
        """Offline fit (no prior) of measured passes; sets the prior and the coefficients. Returns train errors."""
        x = np.stack([s.features(self.features) for s in shapes])
        y = np.asarray(seconds, dtype=np.float64)
        self.coef = self.prior = huber_fit(x, y)
        return relative_errors(x @ self.coef, y)

    def heldout_errors(self) -> dict[str, float]:
        """Errors of each recent pass's prediction made *before* the pass was observed (held-out: prequential,
        with the coefficients of that moment)."""
        return relative_errors([p for p, _ in self._heldout], [m for _, m in self._heldout])

    def reset_heldout(self) -> None:
        """Forget the held-out record (e.g. after a warm-up)."""
        self._heldout.clear()

    def window_pairs(self) -> tuple[list[float], list[float]]:
        """(predicted by the current coefficients, measured) seconds of the passes in the window."""
        if not self._obs:
            return [], []
        x = np.stack([o[0] for o in self._obs])
        return (x @ self.coef).tolist(), [o[1] for o in self._obs]

    def window_errors(self) -> dict[str, float]:
        """Errors of the current coefficients on the observation window."""
        if not self._obs:
            return relative_errors([], [])
        x = np.stack([o[0] for o in self._obs])
        return relative_errors(x @ self.coef, [o[1] for o in self._obs])

    # ---------------------------------------------------------------- other parts of a step
    def observe_parts(self, rows: int, absorbed: int | None = None, **seconds: float | None) -> None:
        """Record measured ``t_draft`` / ``t_pred`` / ``t_select`` of a step with ``rows`` batch rows whose
        drafter and predictor absorbed ``absorbed`` committed tokens per row (``None``: unknown). The part's fit
        and median are recomputed at the next prediction after each of the first ``refit_every`` observations
        (and the fit while there is none), then after every ``refit_every`` new ones: each recomputation reads the
        window, ~0.5 ms a step for the draft's and the predictor's fits when it ran after every observation."""
        for part, sec in seconds.items():
            if part not in self._parts:
                raise ValueError(f"unknown step part '{part}'; one of {self.PARTS}")
            if sec is not None:
                key = (part, int(rows))
                win = self._parts[part].setdefault(key[1], deque(maxlen=self.window))
                win.append((float("nan") if absorbed is None else float(absorbed), float(sec)))
                self._part_new[key] = self._part_new.get(key, 0) + 1
                if self._part_new[key] >= self.refit_every or len(win) <= self.refit_every:
                    self._part_fits.pop(key, None)
                    self._part_medians.pop(key, None)
                    self._part_new[key] = 0
                elif key in self._part_fits and self._part_fits[key] is None:  # no fit yet: try again
                    del self._part_fits[key]

    def predict_part(self, part: str, rows: int, absorbed: int | None = None) -> float:
        """Seconds of ``part`` at ``rows`` batch rows (else at the nearest observed batch size; 0 if none):
        :meth:`part_at` for ``absorbed`` tokens when it has a fit, else the window's median."""
        by_rows = self._parts[part]
        if not by_rows:
            return 0.0
        fit = None if absorbed is None else self.part_at(part, rows, absorbed)
        if fit is not None:
            return fit
        key = rows if rows in by_rows else min(by_rows, key=lambda r: (abs(r - rows), r))
        if (part, key) not in self._part_medians:
            self._part_medians[(part, key)] = float(statistics.median(sec for _, sec in by_rows[key]))
        return self._part_medians[(part, key)]

    def part_at(self, part: str, rows: int, absorbed: int) -> float | None:
        """``a + b * absorbed`` fitted on the window of ``part`` at ``rows`` (nearest observed batch size), or
        ``None`` until it holds at least 3 steps with 2 or more distinct absorbed counts."""
        by_rows = self._parts[part]
        if not by_rows:
            return None
        key = rows if rows in by_rows else min(by_rows, key=lambda r: (abs(r - rows), r))
        if (part, key) not in self._part_fits:
            self._part_fits[(part, key)] = self._fit_part(by_rows[key])
        ab = self._part_fits[(part, key)]
        return None if ab is None else float(ab[0] + ab[1] * absorbed)

    @staticmethod
    def _fit_part(obs: Iterable[tuple[float, float]]) -> np.ndarray | None:
        """Non-negative ``(a, b)`` of ``seconds = a + b * absorbed``, or ``None`` without the data.

        A Theil-Sen line (:func:`scipy.stats.theilslopes`: the median of the pairwise slopes) through the window's
        median seconds per absorbed count: robust to slow steps, which are single points at large counts. A
        least-squares line through the same medians let one of them decide: the drafter's first step in a process
        (compiling, ~5.8 s at ~150 absorbed tokens where ~4 ms is usual) made the fit 11-21 ms for steady ~3.6 ms
        drafts (demo checkpoints, Sapphire Rapids, fp32), so every probe after an AR stretch was priced with its
        catch-up and failed, and goodput stayed on its AR floor in 100 % of the steps of ``bench peer``'s 16
        prompts."""
        by_n: dict[float, list[float]] = {}
        count = 0
        for n, sec in obs:
            if n == n and sec > 0:
                by_n.setdefault(n, []).append(sec)
                count += 1
        if count < 3 or len(by_n) < 2:
            return None
        n = np.array(list(by_n), dtype=np.float64)
        sec = np.array([statistics.median(v) for v in by_n.values()])
        b = max(float(theilslopes(sec, n).slope), 0.0)
        a = float(np.median(sec - b * n))
        if a < 0:  # the intercept cannot be negative: a line through the origin, the median of sec / n
            pos = n > 0
            a, b = 0.0, float(np.median(sec[pos] / n[pos])) if pos.any() else 0.0
        return np.array([a, b])

    # ---------------------------------------------------------------- persistence
    def to_dict(self) -> dict[str, Any]:
        parts = {p: {str(r): statistics.median(sec for _, sec in v) for r, v in by.items()}
                 for p, by in self._parts.items()}
        return {"format": _FORMAT, "features": list(self.features), "coef": self.coefficients(),
                "overheads": parts, "meta": self.meta}

    @classmethod
    def from_dict(cls, d: dict[str, Any], **kwargs: Any) -> "CostModel":
        if d.get("format") != _FORMAT:
            raise ValueError(f"'format' is {d.get('format')!r}, expected {_FORMAT!r}")
        parts = {p: {int(r): float(s) for r, s in by.items()} for p, by in d.get("overheads", {}).items()}
        return cls(d["coef"], features=d["features"], overheads=parts, meta=d.get("meta"), **kwargs)

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=2))
        return p

    @classmethod
    def load(cls, path: str | Path, **kwargs: Any) -> "CostModel":
        """Read a JSON cost model; a bad file raises :class:`~specmoe.errors.UserError` naming it."""
        from specmoe.errors import UserError

        p = Path(path)
        try:
            return cls.from_dict(json.loads(p.read_text()), **kwargs)
        except FileNotFoundError as exc:
            raise UserError(f"cost model '{p}' does not exist: run 'platform bench goodput_cost --target DIR' "
                            f"(or the calibrate_cost stage) to make one") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"cost model '{p}' is not a valid {_FORMAT} JSON file ({exc!r}): recreate it with "
                            f"'platform bench goodput_cost --target DIR'") from exc
