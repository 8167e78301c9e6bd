# SPDX-License-Identifier: Apache-2.0
"""One goodput plan's greedy: the running price of the nodes picked so far and its one cost function.

The greedy (:func:`~specmoe.decoding.selection.greedy_packed` for the batch, or
:func:`~specmoe.decoding.selection.greedy_scalar` at batch 1) asks :meth:`Pricing.rate` for the rate each
candidate would give once added, and :meth:`Pricing.take` before it adds the best one. Both price a node with
:meth:`Pricing.seconds`: one verified token, one more padded column where the node widens the batch, and its
expert-layers (those of its path not yet in the buffer; token-only: the expected growth of a random union).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["Pricing"]


class Pricing:
    """Expected tokens ``a`` over predicted step seconds ``t`` of a plan's picks (the roots to start with).

    Args:
        cost: the selector's :class:`~.cost_model.CostModel` (its coefficients).
        count: ``[B]`` int64 verified nodes per row so far (1 for a live row's root, 0 otherwise); updated.
        n: pool size per row (node ``f`` of the flattened pool is in row ``f // n``).
        kv_slots: cached KV slots per row (the per-token attention term).
        t_fixed: draft + predict + select seconds of the step.
        t_ar: predicted verification seconds of the roots alone.
        e0: expert-layers of the roots' pass (beyond the initial buffer).
        union_growth: ``None`` to price each node's own new experts; else the token-only ablation's expected
            expert-layers of a pass of that many tokens.
        stop_drop: :meth:`take` refuses a node that would lower the rate (``stop: drop``).
    """

    def __init__(self, cost, count: np.ndarray, n: int, *, kv_slots: int, t_fixed: float, t_ar: float, e0: float,
                 union_growth: Callable[[int], float] | None, stop_drop: bool) -> None:
        rows = count.shape[0]
        self.c_tok = cost.coefficient("tokens") + cost.coefficient("token_kv") * kv_slots
        self.c_col = cost.coefficient("padded_tokens") * rows  # one more column of a padded batch
        self.c_exp = cost.coefficient("expert_layers")
        self.count, self.n, self.t_fixed = count, n, t_fixed
        self.tokens = int(count.sum())
        self.a, self.t = float(self.tokens), max(t_fixed + t_ar, 1e-12)
        self.width, self.e = 1, e0
        self.union_growth, self.stop_drop = union_growth, stop_drop
        self.picks: list[tuple[int, float, float]] = []  # (node, rate after, t_verify after)

    def seconds(self, row, new):
        """Seconds one more node in ``row`` (an int or an array of rows) adds, ``new`` its path's expert-layers
        not yet in the buffer (ignored by the token-only ablation)."""
        dt = self.c_tok
        if self.c_col:
            dt = dt + self.c_col * (self.count[row] >= self.width)
        if self.union_growth is None:
            return dt + self.c_exp * new
        return dt + self.c_exp * (self.union_growth(self.tokens + 1) - self.e)

    def rate(self, acc, row, new):
        """Expected rate once a node of acceptance ``acc`` in ``row`` is added (arrays of candidates work)."""
        return (self.a + acc) / (self.t + self.seconds(row, new))

    def take(self, node: int, acc: float, new: int) -> bool:
        """Add ``node`` (flat index) unless ``stop_drop`` and it lowers the rate."""
        row = node // self.n
        dt = self.seconds(row, new)
        rate = (self.a + acc) / (self.t + dt)
        if self.stop_drop and rate < self.a / self.t:
            return False
        self.count[row] += 1
        self.width = max(self.width, int(self.count[row]))
        self.a += acc
        self.t += dt
        self.tokens += 1
        self.e = self.e + new if self.union_growth is None else self.union_growth(self.tokens)
        self.picks.append((node, rate, self.t - self.t_fixed))
        return True

    def best_prefix(self, sel: np.ndarray, n_live: int, t_ar: float) -> tuple[float, float]:
        """``stop: best_prefix``: unselect the picks after the best prefix of the greedy order; returns that
        prefix's ``(rate, t_verify)``."""
        if not self.picks:
            return self.a / self.t, self.t - self.t_fixed
        rates = [n_live / (self.t_fixed + t_ar)] + [p[1] for p in self.picks]
        keep = int(np.argmax(rates))
        for f, _, _ in self.picks[keep:]:
            sel.reshape(-1)[f] = False
        return rates[keep], self.picks[keep - 1][2] if keep else t_ar
