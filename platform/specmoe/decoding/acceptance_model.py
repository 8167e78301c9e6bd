# SPDX-License-Identifier: Apache-2.0
"""Acceptance model: the probability that a draft node's whole root-to-node path is accepted.

Per temperature, a logistic calibrates *edges* (acceptance given the parent's): ``c = sigmoid(w0 + w1 * logit(q)
+ w2 * depth + w3 * log(s))`` with ``q = P(path) / P(parent's path)`` and ``s = q / sum of q over the parent's
drafted children``. A path's value is the product of ``c`` over its edges (:meth:`AcceptanceModel.predict_paths`),
so a child is never likelier than its parent. The Gaussian prior is centred on ``w = (0, 1, 0, 0)`` (``c = q``);
MAP refits on a sliding window of edge outcomes (verified non-root nodes whose parent was accepted); ``w1, w3 >=
0`` enforced. ``first=True`` adds ``w4 >= 0`` on whether the edge is its parent's likeliest child.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["AcceptanceModel", "brier_score", "expected_calibration_error", "temperature_key"]

_PRIOR = np.array([0.0, 1.0, 0.0, 0.0])
#: relative prior precision of (bias, slope, depth, share): the bias moves first, the others with more evidence
_PRIOR_SCALE = np.array([0.05, 1.0, 1.0, 0.05])
#: the fifth weight (likeliest child) with ``first=True``: prior 0, as weak as the bias
_FIRST_PRIOR, _FIRST_SCALE = 0.0, 0.05
_CLIP = 1e-6


def temperature_key(temperature: float) -> float:
    """Models are kept per temperature: 0 for greedy, else ``T`` rounded to 3 decimals."""
    return 0.0 if temperature <= 0 else round(float(temperature), 3)


def _features(logp: np.ndarray, depth: np.ndarray, share: np.ndarray | None = None,
              first: np.ndarray | None = None) -> np.ndarray:
    p = np.clip(np.exp(np.asarray(logp, dtype=np.float64)), _CLIP, 1 - _CLIP)
    log_s = np.zeros_like(p) if share is None else np.log(np.clip(np.asarray(share, np.float64), _CLIP, 1.0))
    cols = [np.ones_like(p), np.log(p) - np.log1p(-p), np.broadcast_to(np.asarray(depth, dtype=np.float64), p.shape),
            log_s]
    if first is not None:
        cols.append(np.broadcast_to(np.asarray(first, dtype=np.float64), p.shape))
    return np.stack(cols, axis=-1)


def _tree_edges(path_logp: np.ndarray, parents: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Flat ``[B*N]`` parent indices, edge ``log q``, sibling shares ``s`` and likeliest-child flags of a tree
    (roots and padding: share 1; ``-inf`` / NaN path probabilities weigh nothing)."""
    lp = np.asarray(path_logp, dtype=np.float64)
    par = np.asarray(parents, dtype=np.int64)
    b, n = lp.shape
    flat_par = (np.where(par >= 0, par, 0) + (np.arange(b) * n)[:, None]).reshape(-1)
    lp_flat = np.nan_to_num(lp.reshape(-1), nan=-1e4, neginf=-1e4)
    edge = np.minimum(lp_flat - lp_flat[flat_par], 0.0)
    child = par.reshape(-1) >= 0
    q = np.where(child, np.exp(edge), 0.0)
    total = np.bincount(flat_par, q, minlength=b * n)[flat_par]
    share = np.where(child & (total > 0), q / np.where(total > 0, total, 1.0), 1.0)
    best = np.zeros(b * n)
    np.maximum.at(best, flat_par, q)
    first = (child & (q >= best[flat_par])).astype(np.float64)
    return flat_par, edge, share, first


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


#: weights that must not be negative: the slope on logit q and the share's (likelier edges are likelier)
_MONOTONE = (1, 3)


def _map_fit(x: np.ndarray, y: np.ndarray, lam: np.ndarray, fixed: set[int],
             prior: np.ndarray = _PRIOR) -> np.ndarray:
    """MAP logistic weights (Gaussian prior ``prior``, precisions ``lam``) by damped Newton; the weights in
    ``fixed`` stay at 0."""
    free = np.array([i for i in range(len(prior)) if i not in fixed])
    w = prior.copy()
    w[list(fixed)] = 0.0

    def objective(v: np.ndarray) -> float:  # negative log-posterior
        z = x @ v
        return float(np.sum(np.logaddexp(0.0, z) - y * z) + 0.5 * np.sum(lam * (v - prior) ** 2))

    f = objective(w)
    for _ in range(50):
        p = _sigmoid(x @ w)
        grad = (x.T @ (p - y) + lam * (w - prior))[free]
        hess = ((x * (p * (1 - p))[:, None]).T @ x + np.diag(lam))[np.ix_(free, free)]
        step = np.zeros_like(w)
        step[free] = np.linalg.solve(hess, grad)
        t = 1.0
        while t > 1e-6 and objective(w - t * step) > f - 1e-4 * t * float(grad @ step[free]):
            t *= 0.5
        w = w - t * step
        f_new = objective(w)
        if f - f_new < 1e-9 * max(1.0, abs(f)):
            break
        f = f_new
    return w


def brier_score(pred: np.ndarray, outcome: np.ndarray) -> float:
    """Mean squared error of probabilities against 0/1 outcomes."""
    return float(np.mean((np.asarray(pred, np.float64) - np.asarray(outcome, np.float64)) ** 2))


def expected_calibration_error(pred: np.ndarray, outcome: np.ndarray, bins: int = 10) -> float:
    """``sum_b n_b / n * |mean(pred_b) - mean(outcome_b)|`` over ``bins`` equal-width bins (float64; 1.0 is in
    the last bin). Not torchmetrics' ``binary_calibration_error``: it bins in float32 and gives 1.0 its own bin."""
    pred, outcome = np.asarray(pred, np.float64), np.asarray(outcome, np.float64)
    if pred.size == 0:
        return float("nan")
    idx = np.minimum((pred * bins).astype(np.int64), bins - 1)
    gap = np.abs(np.bincount(idx, pred, bins) - np.bincount(idx, outcome, bins))  # n_b * |mean gap| per bin
    return float(gap.sum() / pred.size)


class _Window:
    """Ring buffer of (features [4], outcome) pairs."""

    def __init__(self, size: int, dim: int = len(_PRIOR)) -> None:
        self.x = np.zeros((size, dim))
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
    """Predicts path acceptance as a product of calibrated edge probabilities; one model per temperature.

    Args:
        window: outcomes kept per temperature.
        refit_every: refit after this many new outcomes (sooner while the window holds few: ``max(8, n / 4)``).
        prior_strength: prior precision (in outcomes' worth) of the slope and depth weights; the bias and share
            weights get a twentieth of it.
    """

    def __init__(self, window: int = 4096, refit_every: int = 128, prior_strength: float = 20.0,
                 first: bool = False) -> None:
        self.window, self.refit_every, self.prior_strength = window, refit_every, prior_strength
        self.first = first
        self.prior = np.append(_PRIOR, _FIRST_PRIOR) if first else _PRIOR
        self.prior_scale = np.append(_PRIOR_SCALE, _FIRST_SCALE) if first else _PRIOR_SCALE
        self.weights: dict[float, np.ndarray] = {}
        self._win: dict[float, _Window] = {}
        self._since: dict[float, int] = {}

    def temperatures(self) -> list[float]:
        """Temperature keys with outcomes or fitted weights."""
        return sorted(set(self._win) | set(self.weights))

    def outcomes(self, temperature: float) -> int:
        """Edge outcomes in the window at ``temperature`` (what the current fit rests on)."""
        win = self._win.get(temperature_key(temperature))
        return 0 if win is None else int(win.n)

    def weights_for(self, temperature: float) -> np.ndarray:
        """``[4]`` (bias, logit q, depth, log share) weights used at ``temperature``."""
        return self.weights.get(temperature_key(temperature), self.prior)

    def predict(self, edge_logp: np.ndarray, depth: np.ndarray, temperature: float,
                share: np.ndarray | None = None, first: np.ndarray | None = None) -> np.ndarray:
        """Edge acceptance probabilities ``c`` from edge ``log q`` (same shape; ``depth`` and ``share``
        broadcastable to it, ``share=None``: 1)."""
        if self.first and first is None:
            first = np.ones(np.shape(edge_logp))  # an only child is its parent's likeliest
        return _sigmoid(_features(edge_logp, depth, share, first if self.first else None)
                        @ self.weights_for(temperature))

    def predict_paths(self, path_logp: np.ndarray, parents: np.ndarray, depth: np.ndarray,
                      temperature: float) -> np.ndarray:
        """Path acceptance ``[B, N]`` (product of calibrated edges; 1 at roots, padding unspecified) of a tree's
        ``[B, N]`` path log-probabilities, parents (-1 at roots; before children) and depths (parent's + 1)."""
        par = np.asarray(parents, dtype=np.int64)
        dep = np.asarray(depth, dtype=np.int64)
        b, n = par.shape
        flat_par, edge, share, first = _tree_edges(path_logp, par)
        log_c = np.log(np.clip(self.predict(edge, dep.reshape(-1), temperature, share, first), 1e-300, 1.0))
        log_a = np.zeros(b * n)
        d_flat = dep.reshape(-1)
        for d in range(1, int(d_flat.max(initial=0)) + 1):  # one vectorised step per depth level
            f = np.flatnonzero((d_flat == d) & (par.reshape(-1) >= 0))
            log_a[f] = log_a[flat_par[f]] + log_c[f]
        return np.exp(log_a).reshape(b, n)

    def observe_paths(self, path_logp: np.ndarray, parents: np.ndarray, depth: np.ndarray, verified: np.ndarray,
                      accepted: np.ndarray, temperature: float) -> int:
        """Add the edge outcomes of a verified tree (``[B, N]`` arrays; ``accepted``: the accepted path, root
        included); returns the number of outcomes added."""
        par = np.asarray(parents, dtype=np.int64)
        acc = np.asarray(accepted, dtype=bool)
        flat_par, edge, share, first = _tree_edges(path_logp, par)
        m = np.asarray(verified, dtype=bool).reshape(-1) & (par.reshape(-1) >= 0) & acc.reshape(-1)[flat_par]
        f = np.flatnonzero(m)
        if f.size:
            self.observe(edge[f], np.asarray(depth).reshape(-1)[f], acc.reshape(-1)[f], temperature, share[f],
                         first[f])
        return int(f.size)

    def observe(self, edge_logp: np.ndarray, depth: np.ndarray, accepted: np.ndarray, temperature: float,
                share: np.ndarray | None = None, first: np.ndarray | None = None) -> None:
        """Add edge outcomes (flat arrays: ``log q``, depth, accepted given the parent was, sibling share
        (``None``: 1)); refits as the class docstring says."""
        key = temperature_key(temperature)
        if self.first:
            first = np.ones(np.size(edge_logp)) if first is None else np.ravel(first)
        x = _features(np.ravel(edge_logp), np.ravel(depth), None if share is None else np.ravel(share),
                      first if self.first else None)
        y = np.ravel(np.asarray(accepted, dtype=np.float64))
        if y.size == 0:
            return
        self._win.setdefault(key, _Window(self.window, len(self.prior))).add(x, y)
        self._since[key] = self._since.get(key, 0) + y.size
        if self._since[key] >= min(self.refit_every, max(8, self._win[key].n // 4)):
            self.refit(key)

    def refit(self, temperature: float) -> None:
        """MAP logistic fit of the window at ``temperature``; a monotone weight the fit wants negative is fixed at
        0 and the others refitted."""
        key = temperature_key(temperature)
        self._since[key] = 0
        win = self._win.get(key)
        if win is None or win.n == 0:
            return
        x, y = win.data()
        fixed: set[int] = set()
        while True:
            w = _map_fit(x, y, self.prior_strength * self.prior_scale, fixed, self.prior)
            negative = {i for i in (*_MONOTONE, 4)[:len(self.prior) - 2] if w[i] < 0} - fixed
            if not negative:
                break
            fixed |= negative
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
        # weights saved before the share term (3 of them) read with a share weight of 0
        m.weights = {float(k): np.pad(np.asarray(w, dtype=np.float64), (0, len(m.prior) - len(w)))
                     for k, w in d.get("weights", {}).items()}
        return m
