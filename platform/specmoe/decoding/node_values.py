# SPDX-License-Identifier: Apache-2.0
"""Calibrated node values for the tree selectors: P(node's root-to-node path is accepted), learned online.

Ranks by :class:`~specmoe.decoding.acceptance_model.AcceptanceModel` path values instead of the (often
under-confident) draft ``P(path)``, which they equal before any outcome; a child is never worth more than its
parent. A step adds no host read (outcomes stay on the device until :meth:`NodeValues.flush`). Verification does
not read the values: losslessness is untouched.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from specmoe.decoding.acceptance_model import AcceptanceModel, temperature_key
from specmoe.decoding.selection import SCALAR_POOL
from specmoe.interfaces.tree import DraftTree

__all__ = ["NodeValues", "path_values", "path_values_host", "path_values_lists", "accepted_in_pool"]

_CLIP = 1e-6
_LOG_LO, _LOG_HI = math.log(_CLIP), math.log1p(-_CLIP)


def path_values(tree: DraftTree, weights: torch.Tensor) -> torch.Tensor:
    """``[B, N]`` float32 path values of ``tree`` under edge weights ``[4]`` (bias, logit q, depth, log share) or
    ``[5]`` (plus the likeliest-child flag), on the tree's device: ``c = sigmoid(w . x)`` per edge (1 at roots),
    multiplied over each root-to-node path; ``q = exp(DraftTree.logp)``."""
    child = tree.parents >= 0
    pidx = tree.parents.clamp(min=0)
    lp = tree.logp.float().clamp(_LOG_LO, _LOG_HI)  # log q, clipped as the model clips q
    q = lp.exp() * child
    total = torch.zeros_like(q).scatter_add_(1, pidx, q).gather(1, pidx)
    cols = [lp - torch.log1p(-lp.exp()), tree.depth.float(),
            (lp - total.clamp(min=1e-30).log()).clamp(max=0.0, min=_LOG_LO)]
    if weights.shape[0] == 5:
        best = torch.zeros_like(q).scatter_reduce_(1, pidx, q, "amax").gather(1, pidx)
        cols.append((q >= best).float())
    x = torch.stack(cols, dim=-1)
    w = weights.to(device=lp.device, dtype=torch.float32)
    log_c = torch.nn.functional.logsigmoid(x @ w[1:] + w[0]) * child
    return torch.bmm(tree.ancestors().float(), log_c[:, :, None]).squeeze(-1).exp()


def _log_sigmoid(z: float) -> float:
    return -math.log1p(math.exp(-z)) if z >= 0 else z - math.log1p(math.exp(z))


def path_values_host(tree: DraftTree, weights: Sequence[float]) -> torch.Tensor:
    """:func:`path_values` in plain Python from one host read (float64 inside, float32 out; small CPU pools)."""
    return torch.tensor(path_values_lists(tree, weights), dtype=torch.float32)


def path_values_lists(tree: DraftTree, weights: Sequence[float]) -> list[list[float]]:
    """:func:`path_values_host`'s float64 values as ``B`` lists of ``N`` floats (padding nodes: unspecified)."""
    w = [float(x) for x in weights]
    first = len(w) == 5
    out = []
    for lps, par, dep in zip(tree.logp.tolist(), tree.parents.tolist(), tree.depth.tolist()):
        n = len(lps)
        lp = [min(max(x, _LOG_LO), _LOG_HI) for x in lps]
        q = [math.exp(lp[i]) if par[i] >= 0 else 0.0 for i in range(n)]
        total, best = [0.0] * n, [0.0] * n
        for i in range(n):
            p = max(par[i], 0)
            total[p] += q[i]
            best[p] = max(best[p], q[i])
        s = [0.0] * n
        for i in range(n):
            if par[i] < 0:
                continue
            p = par[i]
            share = min(max(lp[i] - math.log(max(total[p], 1e-30)), _LOG_LO), 0.0)
            z = w[0] + w[1] * (lp[i] - math.log1p(-q[i])) + w[2] * dep[i] + w[3] * share
            if first:
                z += w[4] * (1.0 if q[i] >= best[p] else 0.0)
            s[i] = s[p] + _log_sigmoid(z)
        out.append([math.exp(v) for v in s])
    return out


def accepted_in_pool(sel: torch.Tensor, order: torch.Tensor, paths: Sequence[Sequence[int]],
                     width: int) -> torch.Tensor:
    """``[B, N]`` bool pool nodes of each row's accepted path (root included) from ``paths`` (indices into the
    verified subset ``order [B, width]`` of the pool)."""
    acc_w = torch.zeros(len(paths), width, dtype=torch.bool)
    for b, p in enumerate(paths):
        acc_w[b, list(p)] = True
    return torch.zeros_like(sel).scatter_(1, order, acc_w.to(sel.device))


class NodeValues:
    """Online-calibrated node values (one :class:`AcceptanceModel`, per temperature). ``window``: edge outcomes
    kept per temperature; ``flush_every``: at most this many steps' outcomes are kept on the device."""

    def __init__(self, window: int = 4096, flush_every: int = 1024) -> None:
        self.model = AcceptanceModel(window=window, first=True)
        self.flush_every = max(int(flush_every), 1)
        self._pending: list[tuple] = []  # per step: the pool's tensors, selected, order, paths, temperature
        self._w: dict[float, tuple[int, torch.Tensor]] = {}  # temperature -> (id of the host weights, tensor)

    def weights(self, temperature: float, device: torch.device) -> torch.Tensor:
        """The model's current weights at ``temperature`` on ``device`` (copied once per refit)."""
        key = temperature_key(temperature)
        host = self.model.weights_for(key)
        hit = self._w.get(key)
        if hit is None or hit[0] != id(host) or hit[1].device != torch.device(device):
            hit = self._w[key] = (id(host), torch.as_tensor(np.asarray(host, np.float32), device=device))
        return hit[1]

    def values(self, tree: DraftTree, temperature: float) -> torch.Tensor:
        """``[B, N]`` calibrated path values of ``tree`` (:func:`path_values`, or :func:`path_values_host` when
        ``B * N <= SCALAR_POOL`` on the CPU)."""
        if tree.tokens.device.type == "cpu" and tree.batch_size * tree.num_nodes <= SCALAR_POOL:
            return path_values_host(tree, self.model.weights_for(temperature_key(temperature)))
        return path_values(tree, self.weights(temperature, tree.tokens.device))

    def record(self, tree: DraftTree, selected: torch.Tensor, order: torch.Tensor, paths: Sequence[Sequence[int]],
               temperature: float) -> None:
        """Keep a step's outcomes (references only, no tensor operation): the pool, its selection ``[B, N]``, the
        verified subset ``order [B, W]`` and each row's accepted path as indices into it."""
        if self._pending and (self._pending[-1][0].shape != tree.path_logp.shape
                              or self._pending[-1][-1] != temperature):
            self.flush()
        self._pending.append((tree.path_logp, tree.parents, tree.depth, tree.valid, selected, order,
                              [list(p) for p in paths], temperature))
        if len(self._pending) >= self.flush_every:
            self.flush()

    def flush(self) -> int:
        """Hand the kept outcomes to the model (one host read); returns the edge outcomes added."""
        if not self._pending:
            return 0
        temperature = self._pending[0][-1]
        rows = []
        for path_logp, parents, depth, valid, sel, order, paths, _ in self._pending:
            acc = accepted_in_pool(sel, order, paths, order.shape[1])
            rows.append(torch.stack([path_logp.double(), parents.double(), depth.double(), (sel & valid).double(),
                                     acc.double()], dim=-1))  # [B, N, 5]
        self._pending.clear()
        host = torch.cat(rows, dim=0).cpu().numpy()
        return self.model.observe_paths(host[..., 0], host[..., 1].astype(np.int64), host[..., 2].astype(np.int64),
                                        host[..., 3] > 0.5, host[..., 4] > 0.5, temperature)
