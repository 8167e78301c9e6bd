# SPDX-License-Identifier: Apache-2.0
"""Acceptance model: the probability that a draft node's whole root-to-node path is accepted.

Per temperature, a logistic model ``a = sigmoid(w0 + w1 * logit(P(path)) + w2 * depth)`` with a Gaussian prior
centred on ``w = (0, 1, 0)``, i.e. on ``a = P(path)`` (the draft's own probability taken at face value), so an
unfitted model is usable and a short window cannot push it far. It is refitted (MAP, Newton) on a sliding
window of outcomes of verified nodes: a verified node is a success when it lies on the accepted path.
``w1 >= 0`` and ``w2 <= 0`` are enforced, so a child is never predicted likelier than its parent.

Calibration is reported as the Brier score and the expected calibration error (ECE, equal-width bins).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["AcceptanceModel", "brier_score", "expected_calibration_error", "temperature_key"]

_PRIOR = np.array([0.0, 1.0, 0.0])
#: relative prior precision of (bias, slope, depth): a drafter's probabilities are often off by a roughly
#: constant factor in odds (EAGLE-3 heads trained with a soft target are under-confident at T = 0), which the
#: bias absorbs from a few dozen outcomes; the slope and depth terms move only with more evidence
_PRIOR_SCALE = np.array([0.05, 1.0, 1.0])
_CLIP = 1e-6


def temperature_key(temperature: float) -> float:
    """Models are kept per temperature: 0 for greedy, else ``T`` rounded to 3 decimals."""
    return 0.0 if temperature <= 0 else round(float(temperature), 3)


def _features(path_logp: np.ndarray, depth: np.ndarray) -> np.ndarray:
    p = np.clip(np.exp(np.asarray(path_logp, dtype=np.float64)), _CLIP, 1 - _CLIP)
    return np.stack([np.ones_like(p), np.log(p) - np.log1p(-p), np.asarray(depth, dtype=np.float64)], axis=-1)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def brier_score(pred: np.ndarray, outcome: np.ndarray) -> float:
    """Mean squared error of probabilities against 0/1 outcomes."""
    return float(np.mean((np.asarray(pred, np.float64) - np.asarray(outcome, np.float64)) ** 2))


def expected_calibration_error(pred: np.ndarray, outcome: np.ndarray, bins: int = 10) -> float:
    """``sum_b n_b / n * |mean(pred_b) - mean(outcome_b)|`` over ``bins`` equal-width probability bins."""
    pred, outcome = np.asarray(pred, np.float64), np.asarray(outcome, np.float64)
    if pred.size == 0:
        return float("nan")
    idx = np.minimum((pred * bins).astype(np.int64), bins - 1)
    gap = np.abs(np.bincount(idx, pred, bins) - np.bincount(idx, outcome, bins))  # n_b * |mean gap| per bin
    return float(gap.sum() / pred.size)


class _Window:
    """Ring buffer of (features [3], outcome) pairs."""

    def __init__(self, size: int) -> None:
        self.x = np.zeros((size, 3))
        self.y = np.zeros(size)
        self.n = 0
        self.head = 0

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        size = len(self.y)
        x, y = x[-size:], y[-size:]
        idx = (self.head + np.arange(len(y))) % size
        self.x[idx], self.y[idx] = x, y
        self.head = int((self.head + len(y)) % size)
        self.n = min(self.n + len(y), size)

    def data(self) -> tuple[np.ndarray, np.ndarray]:
        return self.x[:self.n], self.y[:self.n]


class AcceptanceModel:
    """Predicts path acceptance from ``(path log-probability, depth)``; one logistic model per temperature.

    Args:
        window: outcomes kept per temperature.
        refit_every: refit after this many new outcomes (sooner while the window is small: after 8 new
            outcomes, or a quarter of the window's, whichever is more, so the first outcomes count at once).
        prior_strength: precision of the Gaussian prior around ``a = P(path)`` (in outcomes' worth) on the slope
            and depth weights; the bias gets a twentieth of it.
    """

    def __init__(self, window: int = 4096, refit_every: int = 128, prior_strength: float = 20.0) -> None:
        self.window, self.refit_every, self.prior_strength = window, refit_every, prior_strength
        self.weights: dict[float, np.ndarray] = {}
        self._win: dict[float, _Window] = {}
        self._since: dict[float, int] = {}

    def temperatures(self) -> list[float]:
        """Temperature keys with outcomes or fitted weights."""
        return sorted(set(self._win) | set(self.weights))

    def weights_for(self, temperature: float) -> np.ndarray:
        """``[3]`` (bias, logit P(path), depth) weights used at ``temperature``."""
        return self.weights.get(temperature_key(temperature), _PRIOR)

    def predict(self, path_logp: np.ndarray, depth: np.ndarray, temperature: float) -> np.ndarray:
        """Acceptance probabilities, same shape as ``path_logp`` (``depth`` broadcastable to it)."""
        return _sigmoid(_features(path_logp, depth) @ self.weights_for(temperature))

    def observe(self, path_logp: np.ndarray, depth: np.ndarray, accepted: np.ndarray, temperature: float) -> None:
        """Add outcomes of verified non-root nodes (flat arrays); refits as the class docstring says."""
        key = temperature_key(temperature)
        x = _features(np.ravel(path_logp), np.ravel(depth))
        y = np.ravel(np.asarray(accepted, dtype=np.float64))
        if y.size == 0:
            return
        self._win.setdefault(key, _Window(self.window)).add(x, y)
        self._since[key] = self._since.get(key, 0) + y.size
        if self._since[key] >= min(self.refit_every, max(8, self._win[key].n // 4)):
            self.refit(key)

    def refit(self, temperature: float) -> None:
        """MAP logistic fit of the window at ``temperature`` (Newton), monotonicity enforced."""
        key = temperature_key(temperature)
        self._since[key] = 0
        win = self._win.get(key)
        if win is None or win.n == 0:
            return
        x, y = win.data()
        lam = self.prior_strength * _PRIOR_SCALE  # [3] precision per weight

        def objective(w: np.ndarray) -> float:  # negative log-posterior
            z = x @ w
            return float(np.sum(np.logaddexp(0.0, z) - y * z) + 0.5 * np.sum(lam * (w - _PRIOR) ** 2))

        w = _PRIOR.copy()
        f = objective(w)
        for _ in range(50):  # Newton with backtracking (plain Newton can diverge on logistic losses)
            p = _sigmoid(x @ w)
            grad = x.T @ (p - y) + lam * (w - _PRIOR)
            hess = (x * (p * (1 - p))[:, None]).T @ x + np.diag(lam)
            step = np.linalg.solve(hess, grad)
            t = 1.0
            while t > 1e-6 and objective(w - t * step) > f - 1e-4 * t * float(grad @ step):
                t *= 0.5
            w = w - t * step
            f_new = objective(w)
            if f - f_new < 1e-9 * max(1.0, abs(f)):
                break
            f = f_new
        w[1], w[2] = max(w[1], 0.0), min(w[2], 0.0)
        self.weights[key] = w

    def calibration(self, temperature: float, bins: int = 10) -> dict[str, float]:
        """Brier score and ECE of the current weights on the window at ``temperature``."""
        win = self._win.get(temperature_key(temperature))
        if win is None or win.n == 0:
            return {"brier": float("nan"), "ece": float("nan"), "n": 0}
        x, y = win.data()
        pred = _sigmoid(x @ self.weights_for(temperature))
        return {"brier": brier_score(pred, y), "ece": expected_calibration_error(pred, y, bins), "n": int(y.size)}

    def to_dict(self) -> dict[str, Any]:
        return {"weights": {str(k): w.tolist() for k, w in self.weights.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any], **kwargs: Any) -> "AcceptanceModel":
        m = cls(**kwargs)
        m.weights = {float(k): np.asarray(w, dtype=np.float64) for k, w in d.get("weights", {}).items()}
        return m
