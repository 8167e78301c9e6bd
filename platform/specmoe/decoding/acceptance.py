# SPDX-License-Identifier: Apache-2.0
"""Lossless acceptance on a verified draft tree.

Greedy (T = 0): from the root, move to the child whose token is the target's argmax; the bonus token is the argmax
at the last accepted node. Sampling (T > 0): recursive rejection with deterministic drafts (EAGLE/SGLang): child
``x`` is accepted with probability ``p(x)``, else ``p(x) = 0`` and ``p`` renormalised; the bonus is drawn from the
residual (or from ``p`` after a full path). The output has exactly the target's distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Acceptance", "target_probs", "greedy_accept", "greedy_walk", "greedy_paths", "sample_accept", "accept"]


@dataclass
class Acceptance:
    """Result for one row: ``path``, indices (into the verified nodes) of the accepted root-to-node path, root
    first; ``bonus``, the token the target emits after it."""

    path: list[int]
    bonus: int


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``[..., V]`` logits -> float32 probabilities of ``softmax(logits / T)``."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def _children(parents: list[int], valid: list[bool]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0 and valid[i]:
            kids[p].append(i)
    return kids


def greedy_accept(tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor,
                  logits: torch.Tensor) -> Acceptance:
    """One row: ``tokens [M]``, ``parents [M]``, ``valid [M]``, ``logits [M, V]`` of the verified nodes."""
    return greedy_walk(logits.argmax(dim=-1).tolist(), tokens.tolist(), parents.tolist(), valid.tolist())


def greedy_walk(argmax: list[int], toks: list[int], parents: list[int], valid: list[bool]) -> Acceptance:
    """:func:`greedy_accept` on host lists: the target's ``argmax [M]`` at each verified node, and the nodes'
    ``toks``, ``parents``, ``valid`` ``[M]``."""
    kids = _children(parents, valid)
    path = [0]
    while True:
        want = argmax[path[-1]]
        nxt = next((c for c in kids[path[-1]] if toks[c] == want), None)
        if nxt is None:
            return Acceptance(path, want)
        path.append(nxt)


def greedy_paths(tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, ancestors: torch.Tensor,
                 logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`greedy_accept` for a whole batch in tensor operations (no host sync) -> ``(path [B, M] bool,
    bonus [B] int64)``: the accepted nodes (root included when valid) and the target's argmax at the deepest.

    Args:
        tokens, parents, valid: ``[B, M]`` of the verified nodes (parents precede children).
        ancestors: ``[B, M, M]`` bool ancestor-or-self matrix.
        logits: ``[B, M, V]``.
    """
    m = tokens.shape[1]
    best = logits.argmax(dim=-1)  # [B, M]
    par = parents.clamp(min=0)
    hit = (tokens == best.gather(1, par)) & valid & (parents >= 0)
    earlier = torch.ones(m, m, dtype=torch.bool, device=tokens.device).tril(-1)[None]  # j < i
    child = valid & (parents >= 0)
    twin = (par[:, :, None] == par[:, None, :]) & (tokens[:, :, None] == tokens[:, None, :]) & child[:, None, :]
    hit = hit & ~(twin & earlier).any(dim=-1)
    hit[:, 0] = True  # the root
    path = ~(ancestors & ~hit[:, None, :]).any(dim=-1) & valid
    deepest = (path.long() * ancestors.sum(dim=-1)).argmax(dim=-1)  # depth + 1 of path nodes, 0 elsewhere
    return path, best.gather(1, deepest[:, None])[:, 0]


def sample_accept(tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, logits: torch.Tensor,
                  temperature: float, generator: torch.Generator | None = None) -> Acceptance:
    """One row, sampling at ``temperature > 0`` (see module docstring)."""
    toks = tokens.tolist()
    kids = _children(parents.tolist(), valid.tolist())
    path = [0]
    while True:
        node = path[-1]
        p = target_probs(logits[node], temperature)
        moved = False
        for c in kids[node]:
            x = toks[c]
            px = float(p[x])
            u = float(torch.rand((), generator=generator, device=p.device))
            if u < px:
                path.append(c)
                moved = True
                break
            p = p.clone()
            p[x] = 0.0
            total = p.sum()
            if float(total) <= 0.0:  # everything rejected (p was one-hot)
                break
            p = p / total
        if not moved:
            bonus = int(torch.multinomial(p, 1, generator=generator))
            return Acceptance(path, bonus)


def accept(tokens: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, logits: torch.Tensor,
           temperature: float, generator: torch.Generator | None = None) -> Acceptance:
    """Greedy when ``temperature == 0`` else sampling acceptance (one row)."""
    if temperature <= 0:
        return greedy_accept(tokens, parents, valid, logits)
    return sample_accept(tokens, parents, valid, logits, temperature, generator)
