# SPDX-License-Identifier: Apache-2.0
"""Building blocks for selectors: path expert footprints and greedy ancestor-closed selection.

Three greedy loops with the same semantics: :func:`greedy_select` (torch, any score of the current selection),
:func:`greedy_packed` (numpy over packed bitsets, :class:`PackedPool`) and :func:`greedy_scalar` (plain Python
over :class:`ScalarPool`; faster for small pools of independent rows, see :data:`SCALAR_POOL`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from specmoe.decoding.bitsets import pack_sets, path_unions, popcount_rows
from specmoe.interfaces.tree import DraftTree

__all__ = ["whole_pool", "top_closed", "path_experts", "greedy_select", "PackedPool", "PackedScoreFn", "TakeFn",
           "greedy_packed", "ScalarPool", "ScalarScoreFn", "greedy_scalar", "SCALAR_POOL"]


def whole_pool(tree: DraftTree, budget: int) -> torch.Tensor | None:
    """``[B, N]`` every valid node where the pool has at most ``budget`` nodes, else ``None``: what any greedy
    loop below selects then, whatever the scores."""
    return tree.valid.clone() if tree.num_nodes <= budget else None


def top_closed(tree: DraftTree, key: torch.Tensor, budget: int) -> torch.Tensor:
    """``[B, N]`` bool: the root and the ``budget - 1`` valid nodes of highest ``key [B, N]`` (any float dtype), as
    ancestor-closed sets: each node ranks by the minimum key on its root-to-node path, ties by depth, then index
    (for keys never above the parent's, what the greedy loops select). Host read only for small CPU pools."""
    b, n = key.shape
    k = min(max(int(budget), 1), n)
    if key.device.type == "cpu" and b * n <= SCALAR_POOL:
        return _top_closed_host(key.tolist(), tree.parents.tolist(), tree.depth.tolist(), tree.valid.tolist(), k)
    anc = tree.ancestors()
    inf = torch.tensor(float("inf"), dtype=key.dtype, device=key.device)
    eff = torch.where(anc, key[:, None, :], inf).amin(dim=2).clamp(min=torch.finfo(key.dtype).min)
    eff = eff.masked_fill(~tree.valid, -inf)
    by_depth = torch.argsort(tree.depth, dim=1, stable=True)
    rank = torch.argsort(eff.gather(1, by_depth), dim=1, descending=True, stable=True)
    sel = torch.zeros(b, n, dtype=torch.bool, device=key.device)
    sel.scatter_(1, by_depth.gather(1, rank[:, :k]), True)
    return sel & tree.valid & tree.valid[:, :1]


def _top_closed_host(keys: list, parents: list, depths: list, valids: list, k: int) -> torch.Tensor:
    out = []
    for key, par, dep, val in zip(keys, parents, depths, valids):
        row = [False] * len(key)
        if val[0]:
            eff = list(key)
            for i in range(1, len(key)):  # parents precede children
                if eff[par[i]] < eff[i]:
                    eff[i] = eff[par[i]]
            for i in sorted((i for i in range(len(key)) if val[i]), key=lambda i: (-eff[i], dep[i], i))[:k]:
                row[i] = True
        out.append(row)
    return torch.tensor(out, dtype=torch.bool)


def path_experts(tree: DraftTree, experts: torch.Tensor) -> torch.Tensor:
    """``experts [B, N, L, E]`` per-node sets -> ``[B, N, L * E]`` bool union over each root-to-node path."""
    b, n = experts.shape[:2]
    flat = experts.reshape(b, n, -1).float()
    return torch.bmm(tree.ancestors().float(), flat) > 0


#: ``score(selected [B, N] bool) -> [B, N]`` float scores of every node given the current selection
ScoreFn = Callable[[torch.Tensor], torch.Tensor]


def greedy_select(tree: DraftTree, budget: int, score: ScoreFn,
                  on_pick: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
                  joint: bool = False) -> torch.Tensor:
    """``[B, N]`` bool: the root, then repeatedly the best-scoring frontier node (unselected, parent selected),
    so the set stays ancestor-closed; ``budget`` (γ) nodes per row, root included.

    Args:
        score: see :data:`ScoreFn`.
        on_pick: called with ``(rows [P], nodes [P])`` after each pick (e.g. to update an expert buffer).
        joint: one pick per iteration across the batch (rows share state, e.g. a buffer); else one per row.
    """
    bsz, n = tree.tokens.shape
    dev = tree.tokens.device
    sel = torch.zeros(bsz, n, dtype=torch.bool, device=dev)
    sel[:, 0] = tree.valid[:, 0]
    rows = torch.arange(bsz, device=dev)
    if on_pick is not None:
        live = rows[sel[:, 0]]
        on_pick(live, torch.zeros_like(live))
    picks_left = torch.full((bsz,), max(budget - 1, 0), device=dev) * sel[:, 0]
    while bool((picks_left > 0).any()):
        parent_sel = sel.gather(1, tree.parents.clamp(min=0)) & (tree.parents >= 0)
        cand = tree.valid & ~sel & parent_sel & (picks_left > 0)[:, None]
        if not bool(cand.any()):
            break
        s = score(sel).masked_fill(~cand, float("-inf"))
        if joint:
            flat = int(s.reshape(-1).argmax())
            r, c = torch.tensor([flat // n], device=dev), torch.tensor([flat % n], device=dev)
        else:
            has = cand.any(dim=1)
            r = rows[has]
            c = s[has].argmax(dim=1)
        sel[r, c] = True
        picks_left[r] -= 1
        if on_pick is not None:
            on_pick(r, c)
    return sel


@dataclass
class PackedPool:
    """A batch of candidate pools on the host, with packed path expert footprints.

    Attributes:
        parents, valid: ``[B, N]`` int64 (``-1`` at the root) and bool.
        paths: ``[B, N, W]`` uint64 union of the predicted sets on each root-to-node path, or ``None``.
        kids, start: CSR of valid children: node ``f = b * N + i`` has ``kids[start[f]:start[f + 1]]`` (flat).
    """

    parents: np.ndarray
    valid: np.ndarray
    paths: np.ndarray | None
    kids: np.ndarray
    start: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.parents.shape

    @classmethod
    def build(cls, tree: DraftTree, experts: torch.Tensor | None = None) -> "PackedPool":
        """From a tree and optional ``[B, N, L, E]`` bool predicted sets (one copy to the host)."""
        parents = tree.parents.detach().cpu().numpy()
        valid = tree.valid.detach().cpu().numpy()
        b, n = parents.shape
        paths = None
        if experts is not None:
            paths = path_unions(pack_sets(experts), parents, tree.depth.detach().cpu().numpy(), valid)
        par_flat = (parents + (np.arange(b, dtype=np.int64) * n)[:, None]).reshape(-1)
        child = np.flatnonzero((parents >= 0).reshape(-1) & valid.reshape(-1))
        kids = child[np.argsort(par_flat[child], kind="stable")]
        start = np.searchsorted(par_flat[kids], np.arange(b * n + 1))
        return cls(parents=parents, valid=valid, paths=paths, kids=kids, start=start)


#: ``score(nodes [C] flat index b * N + i, new [C] int64 | None) -> [C]`` scores of the current candidates;
#: ``new`` is ``|path(node) \ buffer|`` (their buffer: shared, or the row's) when the pool has paths
PackedScoreFn = Callable[[np.ndarray, "np.ndarray | None"], np.ndarray]
#: ``take(node, new) -> bool``: called with the best candidate before it is added; False ends the selection
#: (joint) or that row's selection
TakeFn = Callable[[int, int], bool]


def _buffer_complement(roots: np.ndarray, live: np.ndarray, b: int, buffer: np.ndarray | None,
                       shared: bool) -> np.ndarray:
    """``[1 or B, W]`` complement of the initial packed buffer (``buffer`` plus the live roots' paths ``roots``):
    the new experts of a path are ``popcount(path & complement)``."""
    buf = np.zeros((1 if shared else b, roots.shape[1]), dtype=np.uint64)
    if buffer is not None:
        buf |= buffer
    if shared:
        buf[0] |= np.bitwise_or.reduce(roots, axis=0)
    else:
        buf[live] |= roots
    return ~buf


def greedy_packed(pool: PackedPool, budget: int, score: PackedScoreFn, *, buffer: np.ndarray | None = None,
                  shared: bool = True, joint: bool = False, take: TakeFn | None = None) -> np.ndarray:
    """:func:`greedy_select` on a :class:`PackedPool` (``[B, N]`` bool), the expert buffer kept as packed words.

    Ties go to the lowest index (``b * N + i`` when ``joint``). After each pick the buffer grows by the picked
    node's path (the roots' paths are in it from the start).

    Args:
        score, take: see :data:`PackedScoreFn`, :data:`TakeFn`.
        buffer: ``[W]`` uint64 initial buffer B0 (added to every row's buffer).
        shared: one buffer for the batch, else one per row.
        joint: one pick per iteration across the batch; else every row with candidates picks once.
    """
    b, n = pool.shape
    sel = np.zeros(b * n, dtype=bool)
    cand = np.zeros(b * n, dtype=bool)
    left = [0] * b  # python scalars: cheap per pick
    kids, start = pool.kids, pool.start.tolist()
    paths = None if pool.paths is None else pool.paths.reshape(b * n, -1)
    live = np.flatnonzero(pool.valid[:, 0])
    nbuf = None if paths is None else _buffer_complement(paths[live * n], live, b, buffer, shared)
    npaths = None if paths is None else ~paths
    sel[live * n] = True
    for r in live.tolist():
        left[r] = max(budget - 1, 0)
        if left[r] > 0:
            cand[kids[start[r * n]:start[r * n + 1]]] = True

    def commit(f: int) -> None:
        sel[f] = True
        cand[f] = False
        r = f // n
        left[r] -= 1
        if left[r] == 0:
            cand[r * n:(r + 1) * n] = False
        else:
            cand[kids[start[f]:start[f + 1]]] = True
        if nbuf is not None:
            row = nbuf0 if shared else nbuf[r]
            np.bitwise_and(row, npaths[f], out=row)

    nbuf0 = nbuf[0] if nbuf is not None else None  # a view, updated in place
    while True:
        idx = cand.nonzero()[0]
        if idx.size == 0:
            break
        new = None
        if paths is not None:
            new = popcount_rows(paths[idx] & (nbuf0 if shared else nbuf[idx // n]))
        s = np.asarray(score(idx, new))
        if joint:
            k = int(s.argmax())
            f = int(idx[k])
            if take is not None and not take(f, 0 if new is None else int(new[k])):
                break
            commit(f)
            continue
        s = s.astype(np.float64) if s.dtype.kind != "f" else s
        dense = np.full(b * n, -np.inf, dtype=s.dtype)
        dense[idx] = np.maximum(s, np.finfo(s.dtype).min)  # a -inf candidate still beats a non-candidate
        best = dense.reshape(b, n).argmax(axis=1)
        for r in np.unique(idx // n):
            f = int(r * n + best[r])
            if take is not None and not take(f, 0 if new is None else int(new[np.searchsorted(idx, f)])):
                cand[r * n:(r + 1) * n] = False
                continue
            commit(f)
    return sel.reshape(b, n)


#: pools of at most this many nodes (batch x nodes) with independent rows take :func:`greedy_scalar` (faster there)
SCALAR_POOL = 96


@dataclass
class ScalarPool:
    """A batch of candidate pools as Python lists, for :func:`greedy_scalar`.

    Attributes:
        kids: ``[B][N]`` valid children of each node, ascending.
        roots: rows whose root is valid (live rows).
        paths: ``[B][N]`` union of the predicted sets on each root-to-node path as an int (bit ``l * E + e``).
    """

    kids: list[list[list[int]]]
    roots: list[int]
    paths: list[list[int]] | None

    @classmethod
    def build(cls, tree: DraftTree, experts: torch.Tensor | None = None, *, parents: np.ndarray | None = None,
              valid: np.ndarray | None = None) -> "ScalarPool":
        """From a tree and optional ``[B, N, L, E]`` bool predicted sets (``parents`` / ``valid``: host copies
        the caller already holds)."""
        parents = (tree.parents if parents is None else parents).tolist()
        valid = (tree.valid if valid is None else valid).tolist()
        b, n = len(parents), len(parents[0])
        sets = None
        if experts is not None:
            raw = pack_sets(experts).tobytes()
            size = len(raw) // max(b * n, 1)
            sets = [int.from_bytes(raw[f * size:(f + 1) * size], "little") for f in range(b * n)]
        kids: list[list[list[int]]] = [[[] for _ in range(n)] for _ in range(b)]
        paths = None if sets is None else [[0] * n for _ in range(b)]
        for r in range(b):
            par, ok, kr = parents[r], valid[r], kids[r]
            for i in range(n):  # a parent precedes its children
                if not ok[i]:
                    continue
                p = par[i]
                if p >= 0:
                    kr[p].append(i)
                if paths is not None:
                    paths[r][i] = sets[r * n + i] | (paths[r][p] if p >= 0 else 0)
        return cls(kids=kids, roots=[r for r in range(b) if valid[r][0]], paths=paths)


#: ``score(row, node, new) -> score`` of one candidate; ``new`` is ``|path(node) \ row buffer|`` (0 without
#: paths). Scores of one row must be mutually comparable; the highest wins, ties go to the lowest node index.
ScalarScoreFn = Callable[[int, int, int], Any]


def greedy_scalar(pool: ScalarPool, budget: int, score: ScalarScoreFn, *, buffer: int = 0,
                  take: TakeFn | None = None, shape: tuple[int, int]) -> np.ndarray:
    """:func:`greedy_packed` with one buffer per row (``shared=False``, not joint) in plain Python: ``shape``
    ``(B, N)`` bool. ``buffer``: B0 as an integer of bits; ``take``: :data:`TakeFn` with the row's node index."""
    sel = np.zeros(shape, dtype=bool)
    for r in pool.roots:
        kids = pool.kids[r]
        paths = pool.paths[r] if pool.paths is not None else None
        buf = buffer | paths[0] if paths is not None else 0
        picked = [0]
        cand = list(kids[0])
        for _ in range(budget - 1):
            if not cand:
                break
            best, best_s, best_new = -1, None, 0
            for c in cand:
                new = (paths[c] & ~buf).bit_count() if paths is not None else 0
                s = score(r, c, new)
                if best_s is None or s > best_s or (s == best_s and c < best):
                    best, best_s, best_new = c, s, new
            if take is not None and not take(best, best_new):
                break
            picked.append(best)
            cand.remove(best)
            cand.extend(kids[best])
            if paths is not None:
                buf |= paths[best]
        sel[r, picked] = True
    return sel
