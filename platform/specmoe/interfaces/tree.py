# SPDX-License-Identifier: Apache-2.0
"""Batched draft trees. Node 0 of every row is the root (the committed bonus token the target has not yet
processed); a parent always precedes its children (index order is topological), which consumers rely on."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import torch

__all__ = ["DraftTree", "ancestor_matrix", "is_ancestor_closed", "close_under_ancestors"]


@dataclass
class DraftTree:
    """A batch of draft trees of equal node count ``N`` (root included).

    Attributes:
        tokens: ``[B, N]`` int64 target-vocabulary token ids; ``tokens[:, 0]`` is the root.
        parents: ``[B, N]`` int64 parent index, ``-1`` for the root; ``parents[b, i] < i``.
        depth: ``[B, N]`` int64, 0 for the root.
        logp: ``[B, N]`` float32 draft log-probability of the node's token given its parent (0 at root).
        path_logp: ``[B, N]`` float32 cumulative log-probability of the root-to-node path (0 at root).
        valid: ``[B, N]`` bool; False marks padding nodes (never selected, never verified).
        features: ``[B, N, F]`` drafter state that *proposed* each node (the output of the step that consumed
            its parent; for the root, the committed token before it), ``None`` when ``feature_size`` is 0.
        anc: ``[B, N, N]`` bool ancestor-or-self matrix of ``parents`` (:meth:`ancestors`); ``None``: computed
            on first use. Whoever changes ``parents`` must set it to ``None``.
        value: ``[B, N]`` float32 calibrated probability that the root-to-node path is accepted (1 at the root,
            never above the parent's), set for selectors with ``node_values``; ``None``: rank by :attr:`path_prob`.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    logp: torch.Tensor
    path_logp: torch.Tensor
    valid: torch.Tensor
    features: Optional[torch.Tensor] = None
    anc: Optional[torch.Tensor] = None
    value: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def path_prob(self) -> torch.Tensor:
        """``[B, N]`` cumulative draft probability P(path) of each node (1 at the root)."""
        return self.path_logp.exp()

    @property
    def rank_value(self) -> torch.Tensor:
        """``[B, N]`` what tree selectors rank by: :attr:`value` when set, else :attr:`path_prob`."""
        return self.value if self.value is not None else self.path_prob

    @classmethod
    def from_lists(cls, tokens: list[int], parents: list[int], probs: list[float] | None = None,
                   device: torch.device | str = "cpu") -> "DraftTree":
        """Build a one-row tree from python lists; ``probs`` are the per-edge probabilities P(node | parent)."""
        n = len(tokens)
        if len(parents) != n or parents[0] != -1:
            raise ValueError("parents must have one entry per token and parents[0] must be -1 (the root)")
        for i, p in enumerate(parents[1:], start=1):
            if not 0 <= p < i:
                raise ValueError(f"node {i} has parent {p}: parents must precede their children")
        edge = torch.tensor([1.0] + list(probs[1:] if probs is not None else [1.0] * (n - 1)),
                            dtype=torch.float32)
        logp = edge.log()
        depth = [0] * n
        path = [0.0] * n
        for i in range(1, n):
            depth[i] = depth[parents[i]] + 1
            path[i] = path[parents[i]] + float(logp[i])
        logp[0] = 0.0
        t = lambda x, dt: torch.tensor(x, dtype=dt, device=device).unsqueeze(0)  # noqa: E731
        return cls(tokens=t(tokens, torch.long), parents=t(parents, torch.long), depth=t(depth, torch.long),
                   logp=logp.to(device).unsqueeze(0), path_logp=t(path, torch.float32),
                   valid=torch.ones(1, n, dtype=torch.bool, device=device))

    def ancestors(self) -> torch.Tensor:
        """``[B, N, N]`` bool: ``A[b, i, j]`` is True when node j is on the root-to-i path (i included)."""
        if self.anc is None:
            self.anc = ancestor_matrix(self.parents)
        return self.anc

    def paths(self, b: int = 0) -> list[list[int]]:
        """Root-to-leaf node-index paths of row ``b`` (leaves: valid nodes that are nobody's parent)."""
        par = self.parents[b].tolist()
        val = self.valid[b].tolist()
        has_child = {p for i, p in enumerate(par) if val[i] and p >= 0}
        out = []
        for i in range(len(par)):
            if val[i] and i not in has_child:
                path = [i]
                while par[path[-1]] >= 0:
                    path.append(par[path[-1]])
                out.append(path[::-1])
        return out

    def subset(self, index: torch.Tensor, index_valid: torch.Tensor) -> "DraftTree":
        """Row-wise gather of nodes ``index [B, M]`` (ascending, root first) into a new tree with remapped
        parents; ``index_valid [B, M]`` False marks padding (made a child of the root)."""
        b, n = self.tokens.shape
        remap = torch.full((b, n), -1, dtype=torch.long, device=index.device)
        m = index.shape[1]
        ar = torch.arange(m, device=index.device).expand(b, m)
        remap.scatter_(1, torch.where(index_valid, index, torch.zeros_like(index)),
                       torch.where(index_valid, ar, torch.zeros_like(ar)))
        remap[:, 0] = 0  # root always maps to 0; padding scattered to slot 0 is overwritten here
        g = lambda x: x.gather(1, index)  # noqa: E731
        old_par = g(self.parents)
        new_par = torch.where(old_par >= 0, remap.gather(1, old_par.clamp(min=0)), torch.full_like(old_par, -1))
        new_par = torch.where(index_valid, new_par, torch.zeros_like(new_par))
        new_par[:, 0] = -1
        feats = None
        if self.features is not None:
            feats = self.features.gather(1, index[:, :, None].expand(b, m, self.features.shape[-1]))
        anc = self.ancestors()
        sub = anc.gather(1, index[:, :, None].expand(b, m, n)).gather(2, index[:, None, :].expand(b, m, m))
        eye = torch.eye(m, dtype=torch.bool, device=index.device)[None]
        sub = (sub & index_valid[:, :, None] & index_valid[:, None, :]) | eye
        sub[:, :, 0] |= ~index_valid  # padding rows: self and the root
        return replace(self, tokens=g(self.tokens), parents=new_par, depth=g(self.depth), logp=g(self.logp),
                       path_logp=g(self.path_logp), valid=g(self.valid) & index_valid, anc=sub, features=feats,
                       value=None if self.value is None else g(self.value))


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """``[B, N]`` parents (``-1`` root) -> ``[B, N, N]`` bool ancestor-or-self (pointer jumping, no host sync)."""
    b, n = parents.shape
    dev = parents.device
    has = parents >= 0
    ptr = torch.where(has, parents, torch.arange(n, device=dev).expand(b, n))  # the root points to itself
    anc = torch.eye(n, dtype=torch.bool, device=dev).expand(b, n, n).clone()
    anc.scatter_(2, ptr[:, :, None], has[:, :, None] | anc.gather(2, ptr[:, :, None]))
    for _ in range(math.ceil(math.log2(max(n, 2)))):
        anc = anc | anc.gather(1, ptr[:, :, None].expand(b, n, n))
        ptr = ptr.gather(1, ptr)
    return anc


def is_ancestor_closed(parents: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: every selected node's parent is selected and the root is selected."""
    par_sel = selected.gather(1, parents.clamp(min=0))
    ok_nodes = ~selected | (parents < 0) | par_sel
    return ok_nodes.all(dim=1) & selected[:, 0]


def close_under_ancestors(parents: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """Smallest ancestor-closed superset of ``selected`` ``[B, N]`` (root always included)."""
    anc = ancestor_matrix(parents)
    out = (anc & selected[:, :, None]).any(dim=1)
    out[:, 0] = True
    return out
