# SPDX-License-Identifier: Apache-2.0
"""How much any per-step choice of the draft count could gain over the best fixed one (``platform bench peer``).

Replayed from vLLM's own steps: the longest fixed chain's per-request, per-step accepted counts (vLLM's detailed
per-request speculative metrics, ``per_step_accepted``), at batch 1 and T = 0, where a step's outcome does not
depend on the other requests and the first ``k`` drafts of a chain of ``K`` are the drafts a chain of ``k`` would
propose (greedy drafting). A step that verifies ``k`` drafts commits ``min(a, k) + 1`` tokens (``a``: the drafts
the chain of ``K`` had accepted there) and costs ``c0 + c1 * k`` seconds, a line fitted on the fixed chains'
measured seconds per speculative step (drafting and verifying both grow with ``k``). The replay keeps the chain
of ``K``'s step boundaries (a shorter chain would cut the text at other positions), so it is checked against the
measured fixed chains (``replay_vs_measured``: replayed over measured tokens/s per chain length).

Two rates, each over the best fixed ``k`` (1..``K``) of the replay:

* ``oracle``: every step drafts and verifies exactly the drafts that will be accepted (none: ``c0``, the line's
  value at 0); no causal rule can do better;
* ``history``: a causal rule that chooses ``k`` from the request's own last step, as a policy inside vLLM can
  see it: the position of its first rejected draft, or that all drafts it verified were accepted (``"all"``:
  then the rule does not know how many more would have been); ``k`` from 1 to ``K``. The rule (per state the
  ``k`` of the best expected rate, Dinkelbach's ratio iteration) is fitted on half of the requests and judged on
  the other half against the fixed ``k`` the fitting half picks, both halves in turn, over ``splits`` random
  halvings: ``history`` is the mean ratio, ``history_lo`` / ``history_hi`` the range. The rule knows the last
  outcome when it chooses the next proposal length, which vLLM's scheduler does not (it fixes the next proposal
  before the pass that tells it): an upper bound on such rules.

Pure standard library (the bench's side; the runner only records the counts).
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

__all__ = ["fit_step_cost", "replay", "rate", "headroom"]

State = tuple  # None (a request's first step), ("rej", j) or ("all",)


def fit_step_cost(chains: dict[int, tuple[float, int]]) -> tuple[float, float] | None:
    """Seconds per speculative step as ``c0 + c1 * k``, least squares over the fixed chains ``{k: (seconds,
    steps)}``; None with fewer than two chain lengths or a slope that is not positive."""
    pts = [(float(k), s / n) for k, (s, n) in chains.items() if k > 0 and n > 0 and s > 0]
    if len({k for k, _ in pts}) < 2:
        return None
    mk = sum(k for k, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    c1 = sum((k - mk) * (y - my) for k, y in pts) / sum((k - mk) ** 2 for k, _ in pts)
    if c1 <= 0:
        return None
    return my - c1 * mk, c1


def replay(accepted: Sequence[Sequence[int]], drafted: Sequence[Sequence[int]], choose: Callable[[State], int],
           cost: tuple[float, float], seen: list[tuple[State, int, int]] | None = None) -> tuple[float, float]:
    """Tokens and seconds of a rule ``choose(state) -> k`` over the requests' steps (``accepted[r][t]`` of the
    ``drafted[r][t]`` drafts of the chain; ``k`` is capped by what the chain drafted there). ``seen`` collects
    (state, accepted, drafted) per step as the rule met them."""
    c0, c1 = cost
    tokens = seconds = 0.0
    for acc, dr in zip(accepted, drafted):
        state: State = None
        for a, d in zip(acc, dr):
            if seen is not None:
                seen.append((state, a, d))
            k = min(max(0, int(choose(state))), d)
            got = min(a, k)
            tokens += got + 1
            seconds += c0 + c1 * k
            state = ("all",) if got == k else ("rej", got)
    return tokens, seconds


def _follow(rule: dict[State, int], default: int) -> Callable[[State], int]:
    """The rule as a choice (``default`` in a state it never met)."""
    return lambda s: rule.get(s, default)


def rate(accepted: Sequence[Sequence[int]], drafted: Sequence[Sequence[int]], choose: Callable[[State], int],
         cost: tuple[float, float]) -> float:
    """Tokens per second of the rule over the replayed steps (:func:`replay`)."""
    t, s = replay(accepted, drafted, choose, cost)
    return t / s if s > 0 else 0.0


def _best_fixed(accepted, drafted, cost, kmax: int) -> tuple[int, float]:
    rates = {k: rate(accepted, drafted, _follow({}, k), cost) for k in range(1, kmax + 1)}
    k = max(rates, key=lambda x: (rates[x], x))
    return k, rates[k]


def _fit_rule(accepted, drafted, cost, kmax: int, rounds: int = 4) -> tuple[dict[State, int], int]:
    """Per state the ``k`` that maximises expected tokens minus ``rate x`` seconds (Dinkelbach: ``rate`` the
    rule's own rate on these requests, from the best fixed ``k``'s), the states as the rule itself meets them;
    and that fixed ``k`` (the rule's choice in a state it never met)."""
    k0, lam = _best_fixed(accepted, drafted, cost, kmax)
    rule: dict[State, int] = {}
    for _ in range(rounds):
        seen: list[tuple[State, int, int]] = []
        replay(accepted, drafted, _follow(rule, k0), cost, seen)
        by: dict[State, list[tuple[int, int]]] = {}
        for s, a, d in seen:
            by.setdefault(s, []).append((a, d))
        rule = {s: max(range(1, kmax + 1), key=lambda k, ad=ad: (
            sum(min(a, k, d) + 1 - lam * (cost[0] + cost[1] * min(k, d)) for a, d in ad), -k))
            for s, ad in by.items()}
        lam = max(lam, rate(accepted, drafted, _follow(rule, k0), cost))
    return rule, k0


def headroom(accepted: Sequence[Sequence[int]], drafted: Sequence[Sequence[int]], cost: tuple[float, float],
             splits: int = 10, seed: int = 0) -> dict[str, float | int] | None:
    """The oracle's and the history rule's rate over the best fixed count's (module docstring). None with fewer
    than four requests."""
    accepted = [list(a) for a in accepted]
    drafted = [list(d) for d in drafted]
    kmax = max((d for dr in drafted for d in dr), default=0)
    if len(accepted) < 4 or kmax == 0:
        return None
    k_best, r_best = _best_fixed(accepted, drafted, cost, kmax)
    oracle = replay(accepted, drafted, _follow({}, kmax), cost)[0] / sum(
        cost[0] + cost[1] * min(a, d) for acc, dr in zip(accepted, drafted) for a, d in zip(acc, dr))
    rng = random.Random(seed)
    ratios = []
    for _ in range(splits):
        idx = list(range(len(accepted)))
        rng.shuffle(idx)
        half = len(idx) // 2
        for fit, judge in ((idx[:half], idx[half:]), (idx[half:], idx[:half])):
            fa, fd = [accepted[i] for i in fit], [drafted[i] for i in fit]
            ja, jd = [accepted[i] for i in judge], [drafted[i] for i in judge]
            rule, k_fix = _fit_rule(fa, fd, cost, kmax)
            fixed = rate(ja, jd, _follow({}, k_fix), cost)
            ratios.append(rate(ja, jd, _follow(rule, k_fix), cost) / fixed if fixed > 0 else 1.0)
    return {"best_fixed_k": k_best, "best_fixed_tok_s": r_best, "oracle": oracle / r_best,
            "history": sum(ratios) / len(ratios), "history_lo": min(ratios), "history_hi": max(ratios)}
