# SPDX-License-Identifier: Apache-2.0
"""The acceptance model on synthetic outcomes with a known ground truth: it recovers the generating logistic
model, becomes calibrated (ECE, Brier) where the prior a = P(path) is not, keeps temperatures apart, forgets
old outcomes through its window, and never predicts a child likelier than its parent."""

from __future__ import annotations

import numpy as np
import pytest

from specmoe.decoding.acceptance_model import AcceptanceModel, brier_score, expected_calibration_error

TRUTH = np.array([-0.4, 1.6, -0.3, 0.0])  # bias, logit q, depth, log share (flat outcomes: only children)


def synthetic(n: int, rng: np.random.Generator, w: np.ndarray = TRUTH):
    depth = rng.integers(1, 7, n)
    logp = np.log(rng.uniform(0.01, 0.99, n)) * depth / 2
    p = np.clip(np.exp(logp), 1e-6, 1 - 1e-6)
    a = 1 / (1 + np.exp(-(w[0] + w[1] * np.log(p / (1 - p)) + w[2] * depth + w[3] * 0.0)))
    return logp, depth, rng.random(n) < a, a


def test_recovers_the_generating_model_and_calibrates():
    rng = np.random.default_rng(0)
    m = AcceptanceModel(window=20000, refit_every=1000)
    logp, depth, acc, _ = synthetic(20000, rng)
    before = m.predict(logp, depth, 0.0)
    np.testing.assert_allclose(before, np.clip(np.exp(logp), 1e-6, 1 - 1e-6), rtol=1e-9)  # prior: a = P(path)
    m.observe(logp, depth, acc, 0.0)
    np.testing.assert_allclose(m.weights_for(0.0), TRUTH, atol=0.12)
    test_logp, test_depth, test_acc, test_a = synthetic(20000, rng)
    pred = m.predict(test_logp, test_depth, 0.0)
    assert np.abs(pred - test_a).max() < 0.05
    ece_fit = expected_calibration_error(pred, test_acc)
    ece_prior = expected_calibration_error(m.predict(test_logp, test_depth, 1.0), test_acc)  # T=1: unfitted
    assert ece_fit < 0.02 < ece_prior
    assert brier_score(pred, test_acc) < brier_score(m.predict(test_logp, test_depth, 1.0), test_acc)
    cal = m.calibration(0.0)
    assert cal["n"] == 20000 and cal["ece"] < 0.02


def test_temperatures_are_separate_and_the_window_forgets():
    rng = np.random.default_rng(1)
    other = np.array([0.5, 0.8, -0.1, 0.0])
    m = AcceptanceModel(window=4000, refit_every=500)
    logp, depth, acc, _ = synthetic(4000, rng)
    m.observe(logp, depth, acc, 0.0)
    logp1, depth1, acc1, _ = synthetic(4000, rng, other)
    m.observe(logp1, depth1, acc1, 1.0)
    np.testing.assert_allclose(m.weights_for(0.0), TRUTH, atol=0.25)
    np.testing.assert_allclose(m.weights_for(1.0), other, atol=0.25)
    # the T = 0 regime changes: after a window of new outcomes the old ones are gone
    m.observe(logp1, depth1, acc1, 0.0)
    np.testing.assert_allclose(m.weights_for(0.0), other, atol=0.25)
    restored = AcceptanceModel.from_dict(m.to_dict())
    np.testing.assert_allclose(restored.weights_for(1.0), m.weights_for(1.0))


def test_few_outcomes_stay_near_the_prior_and_children_never_beat_parents():
    m = AcceptanceModel(refit_every=1)
    m.observe(np.log([0.9, 0.8]), [1, 2], [False, False], 0.0)  # two unlucky outcomes
    w = m.weights_for(0.0)
    assert abs(w[1] - 1.0) < 0.2 and w[1] >= 0 and w[2] <= 0
    a = m.predict(np.log([0.9, 0.9, 0.5]), [1, 2, 2], 0.0)
    assert a[1] <= a[0] and a[2] <= a[1]


@pytest.mark.parametrize("pred,outcome,ece", [([0.2] * 10, [1, 1] + [0] * 8, 0.0),
                                               ([0.95] * 4, [0, 0, 0, 0], 0.95)])
def test_ece_by_hand(pred, outcome, ece):
    assert expected_calibration_error(np.array(pred), np.array(outcome)) == pytest.approx(ece)


def test_an_under_confident_drafter_is_corrected_from_few_outcomes():
    """A drafter whose probabilities are 6x too low in odds (as EAGLE-3's at T = 0 on the demo target): after
    48 outcomes, seen a few per step, the model has been refitted (early refits; the default refit_every is
    128) and its mean prediction is off by less than 0.15 on average over 8 runs, where the prior P(path) is
    off by more than 0.35."""
    errors, prior = [], []
    for seed in range(8):
        rng = np.random.default_rng(seed)
        p, depth = rng.uniform(0.05, 0.4, 48), rng.integers(1, 4, 48)
        true = 1 / (1 + (1 - p) / (6 * p))
        outcome = rng.random(48) < true
        m = AcceptanceModel()
        for i in range(0, 48, 4):
            m.observe(np.log(p[i:i + 4]), depth[i:i + 4], outcome[i:i + 4], 0.0)
        errors.append(abs(float(np.mean(m.predict(np.log(p), depth, 0.0) - true))))
        prior.append(float(np.mean(true - p)))
    assert np.mean(errors) < 0.15 and min(prior) > 0.35


def _chain_tree(b: int, depth: int, q: float):
    """``b`` rows of one chain root -> 1 -> ... -> depth, every edge of probability ``q``."""
    n = depth + 1
    parents = np.tile(np.arange(-1, depth), (b, 1))
    dep = np.tile(np.arange(n), (b, 1))
    return dep * np.log(q), parents, dep


def test_paths_are_products_of_calibrated_edges_and_children_never_beat_parents():
    """Edges 4x under-confident in odds at every depth (q = 0.2, accepted 0.5 given the parent): the path
    model learns the edge and predicts 0.5 ** depth, where the drafter's own path probability is 0.2 ** depth
    (at depth 3: 0.125 vs 0.008); whatever the weights (a positive depth weight included) no child is
    predicted likelier than its parent."""
    rng = np.random.default_rng(3)
    m = AcceptanceModel()
    path_logp, parents, depth = _chain_tree(64, 3, 0.2)
    prior = m.predict_paths(path_logp, parents, depth, 0.0)
    np.testing.assert_allclose(prior[0], 0.2 ** np.arange(4), rtol=1e-4)  # unfitted: a = P(path)
    for _ in range(6):  # verify whole chains; each edge accepted with 0.5 while its parent was
        ok = rng.random((64, 3)) < 0.5
        accepted = np.concatenate([np.ones((64, 1), bool), np.cumprod(ok, axis=1).astype(bool)], axis=1)
        assert m.observe_paths(path_logp, parents, depth, np.ones_like(accepted), accepted, 0.0) == \
            64 + accepted[:, 1:3].sum()  # edges with an accepted parent only
    a = m.predict_paths(path_logp, parents, depth, 0.0)
    np.testing.assert_allclose(a[0], 0.5 ** np.arange(4), atol=0.05)
    m.weights[0.0] = np.array([0.5, 0.3, 2.0, 0.0])  # a large positive depth weight
    g = np.random.default_rng(0)
    lp = np.cumsum(np.log(g.uniform(0.01, 1.0, (8, 4))), axis=1)
    lp = np.concatenate([np.zeros((8, 1)), lp], axis=1)
    a = m.predict_paths(lp, np.tile(np.arange(-1, 4), (8, 1)), np.tile(np.arange(5), (8, 1)), 0.0)
    assert (np.diff(a, axis=1) <= 1e-12).all() and (a[:, 0] == 1).all()



def test_the_sibling_share_tells_the_accepted_child_from_its_sibling():
    """Trees of two children per node (the first child's q in 0.1-0.5, its sibling's a random fraction of it:
    an under-confident drafter spreads q thin) whose edges are accepted by a logistic in logit q and the log
    of the edge's share among its siblings (share weight 4, q weight 0.5): observed through whole trees, the
    model learns the share term and predicts path acceptance within 0.03 (mean error < 0.01); the model fed the
    same outcomes without shares (as only children) is off by more than five times as much on average."""
    rng = np.random.default_rng(5)
    truth = np.array([2.0, 0.5, 0.0, 4.0])
    b, depth = 256, 3
    n = 2 * depth + 1  # root 0; nodes 2d-1 (first child) and 2d (its sibling) hang from node 2d-3 (root at d=1)
    parents = np.full((b, n), -1)
    dep = np.zeros((b, n), dtype=np.int64)
    for d in range(1, depth + 1):
        parents[:, 2 * d - 1] = parents[:, 2 * d] = max(2 * d - 3, 0)
        dep[:, 2 * d - 1] = dep[:, 2 * d] = d

    def trees():
        q = np.zeros((b, n))
        q[:, 1::2] = rng.uniform(0.1, 0.5, (b, depth))
        q[:, 2::2] = q[:, 1::2] * rng.uniform(0.1, 1.0, (b, depth))
        share = np.ones((b, n))
        share[:, 1:] = q[:, 1:] / (q[:, 1::2] + q[:, 2::2]).repeat(2, axis=1)
        c = np.ones((b, n))
        c[:, 1:] = 1 / (1 + np.exp(-(truth[0] + truth[1] * np.log(q[:, 1:] / (1 - q[:, 1:]))
                                     + truth[3] * np.log(share[:, 1:]))))
        path_logp = np.zeros((b, n))
        true_a = np.ones((b, n))
        for i in range(1, n):
            path_logp[:, i] = path_logp[:, parents[0, i]] + np.log(q[:, i])
            true_a[:, i] = true_a[:, parents[0, i]] * c[:, i]
        return q, path_logp, c, true_a

    m, flat = AcceptanceModel(), AcceptanceModel()
    for _ in range(8):
        q, path_logp, c, _ = trees()
        accepted = np.zeros((b, n), dtype=bool)
        accepted[:, 0] = True
        for i in range(1, n):
            accepted[:, i] = accepted[:, parents[0, i]] & (rng.random(b) < c[:, i])
        m.observe_paths(path_logp, parents, dep, np.ones_like(accepted), accepted, 0.0)
        seen = accepted[:, np.maximum(parents[0], 0)] & (parents >= 0)
        flat.observe(np.log(q[seen]), dep[seen], accepted[seen], 0.0)
    q, path_logp, _, true_a = trees()
    err = np.abs(m.predict_paths(path_logp, parents, dep, 0.0) - true_a)
    flat_err = np.abs(flat.predict_paths(path_logp, parents, dep, 0.0) - true_a)  # no share weight: w3 = 0
    assert m.weights_for(0.0)[3] > 2.0 and flat.weights_for(0.0)[3] == 0.0
    assert err.max() < 0.03 and err.mean() < 0.01 and flat_err.mean() > 5 * err.mean()


def test_a_slope_the_data_want_negative_is_fixed_at_zero_and_the_rest_refitted():
    """Outcomes that fall with q (a drafter whose confidence is anti-informative on this window): the slope is
    held at 0 (likelier edges are never predicted less likely) and the bias refitted with it, so the mean
    prediction still matches the mean outcome, which clamping the slope after the fit does not give."""
    rng = np.random.default_rng(7)
    q = rng.uniform(0.05, 0.95, 4000)
    acc = rng.random(4000) < 1 / (1 + np.exp(-(1.0 - 1.5 * np.log(q / (1 - q)))))
    m = AcceptanceModel(window=4000, refit_every=4000)
    m.observe(np.log(q), np.ones(4000), acc, 0.0)
    w = m.weights_for(0.0)
    assert w[1] == 0.0
    assert abs(m.predict(np.log(q), np.ones(4000), 0.0).mean() - acc.mean()) < 0.02
