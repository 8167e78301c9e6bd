# SPDX-License-Identifier: Apache-2.0
"""Selection time per step at GPT-OSS-120B dimensions (36 MoE layers, 128 experts, top-4), one CPU thread.

Three cases (the targets of the goodput issue): a 10-node pool (EAGLE's 3 steps x top-2) at gamma 4, batch 1;
the same at batch 8 with the buffer shared by the batch; a 60-node pool (random parents) at gamma 8, batch 8.
Every selector runs on the same ``--trees`` random pools with random top-K expert sets (interleaved, so
machine-load drifts hit all selectors alike); the time of one ``select`` call includes everything the
selector does with the ``[B, N, L, E]`` bool expert sets. Prints the median and p90 per call, and the
ratio median / target. ``--flush-mb`` times every call after writing a buffer larger than the CPU caches, the
state a selection starts in inside a decoding step (after the verification pass has streamed the target's
weights); by default the calls run back to back, warm.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

__all__ = ["add_arguments", "run", "CASES", "random_case", "build_selectors", "measure"]

#: name -> (candidates in the pool, gamma, batch, target ms)
CASES: dict[str, tuple[int, int, int, float]] = {
    "pool10_g4_bs1": (10, 4, 1, 0.3),
    "pool10_g4_bs8": (10, 4, 8, 1.0),
    "pool60_g8_bs8": (60, 8, 8, 3.0),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--selectors", default=None,
                   help="comma-separated registered selector names or 'package.module:Class' import paths "
                        "(default: every registered selector)")
    p.add_argument("--set", action="append", default=None, metavar="SELECTOR.KEY=VALUE",
                   help="a selector option (repeatable; VALUE is JSON or a string); default: goodput.stop=best_prefix "
                        "(its greedy always runs to gamma: the worst case)")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ", ".join(CASES))
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--trees", type=int, default=20, help="random pools per case")
    p.add_argument("--repeats", type=int, default=10, help="timed calls per pool and selector")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the targets are for one)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--flush-mb", type=int, default=0,
                   help="write this many MB before every timed call (cold caches, as inside a decoding step); "
                        "0: warm calls")


def random_case(bsz: int, pool: int, layers: int, experts: int, top_k: int, seed: int) -> tuple[Any, Any]:
    """A random candidate pool ``[B, pool + 1]`` and its ``[B, N, L, E]`` bool expert sets.

    ``pool == 10`` is EAGLE's default pool (3 steps x top-2, :func:`build_pool`); other sizes get random
    parents (each node's parent uniform over the earlier nodes) and random edge probabilities.
    """
    import torch

    from specmoe.decoding.tree_builder import build_pool, pool_size
    from specmoe.interfaces.tree import DraftTree

    g = torch.Generator().manual_seed(seed)
    n = pool + 1
    if pool == pool_size(3, 2) - 1:
        vocab = 64

        def expand(tokens, idx, anc):
            return torch.log_softmax(torch.randn(*tokens.shape, vocab, generator=g) * 2, -1)

        tree = build_pool(torch.zeros(bsz, dtype=torch.long),
                          torch.log_softmax(torch.randn(bsz, vocab, generator=g) * 2, -1), expand, 3, 2)
    else:
        parents = torch.zeros(bsz, n, dtype=torch.long)
        parents[:, 0] = -1
        for i in range(1, n):
            parents[:, i] = torch.randint(0, i, (bsz,), generator=g)
        logp = torch.rand(bsz, n, generator=g).clamp(min=1e-3).log()
        logp[:, 0] = 0
        depth = torch.zeros(bsz, n, dtype=torch.long)
        path = torch.zeros(bsz, n)
        ar = torch.arange(bsz)
        for i in range(1, n):
            depth[:, i] = depth[ar, parents[:, i]] + 1
            path[:, i] = path[ar, parents[:, i]] + logp[:, i]
        tree = DraftTree(tokens=torch.randint(0, 1000, (bsz, n), generator=g), parents=parents, depth=depth,
                         logp=logp, path_logp=path, valid=torch.ones(bsz, n, dtype=torch.bool))
    idx = torch.rand(bsz * n * layers, experts, generator=g).topk(top_k, dim=-1).indices
    sets = torch.zeros(bsz * n * layers, experts, dtype=torch.bool)
    sets.scatter_(1, idx, True)
    return tree, sets.view(bsz, n, layers, experts)


def build_selectors(names: list[str], options: list[str] | None = None) -> dict[str, Any]:
    """Selectors by registry name or import path, with ``SELECTOR.KEY=VALUE`` options; bad input is reported."""
    import json

    from specmoe.errors import UserError
    from specmoe.registry import selectors

    unknown = [s for s in names if ":" not in s and s not in selectors.names()]
    if unknown:
        raise UserError(f"--selectors: {', '.join(unknown)} not registered (have: {', '.join(selectors.names())})")
    kwargs: dict[str, dict[str, Any]] = {s: {} for s in names}
    for opt in options or []:
        key, eq, value = opt.partition("=")
        sel, dot, field = key.rpartition(".")
        if not (eq and dot and field):
            raise UserError(f"--set '{opt}': expected SELECTOR.KEY=VALUE, e.g. goodput.stop=best_prefix")
        if sel in kwargs:
            try:
                kwargs[sel][field] = json.loads(value)
            except json.JSONDecodeError:
                kwargs[sel][field] = value
    out = {}
    for s in names:
        try:
            out[s] = selectors.get(s)(**kwargs[s])
        except TypeError as exc:
            raise UserError(f"--set: bad option for selector '{s}': {exc}") from exc
    return out


def measure(sels: dict[str, Any], cases: list[str], *, layers: int, experts: int, top_k: int, trees: int,
            repeats: int, seed: int, flush_mb: int = 0) -> dict[tuple[str, str], list[float]]:
    """Milliseconds per ``select`` call for every (case, selector); with ``flush_mb`` each call follows a write
    of that many MB (not timed)."""
    import torch

    out: dict[tuple[str, str], list[float]] = {}
    scratch = torch.zeros(flush_mb * 2**18) if flush_mb > 0 else None
    for case in cases:
        pool, gamma, bsz, _ = CASES[case]
        for t in range(trees):
            tree, ex = random_case(bsz, pool, layers, experts, top_k, seed + 1000 * t + pool + bsz)
            for _ in range(repeats):
                for name, sel in sels.items():
                    if scratch is not None:
                        scratch.add_(1.0)
                    t0 = time.perf_counter()
                    sel.select(tree, gamma, ex if sel.needs_experts else None)
                    out.setdefault((case, name), []).append((time.perf_counter() - t0) * 1e3)
    return out


def run(args: argparse.Namespace) -> int:
    import torch

    from specmoe.errors import UserError

    torch.set_num_threads(args.threads)
    if args.selectors is None:
        from specmoe.registry import selectors

        names = selectors.names()
    else:
        names = [s for s in args.selectors.split(",") if s]
    cases = [c for c in args.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        raise UserError(f"--cases: unknown {', '.join(bad)}; choose from {', '.join(CASES)}")
    sels = build_selectors(names, ["goodput.stop=best_prefix"] if args.set is None else args.set)
    for s in sels.values():  # warm-up: first calls import and allocate
        tree, ex = random_case(2, 10, args.layers, args.experts, args.top_k, args.seed)
        s.select(tree, 4, ex if s.needs_experts else None)
    times = measure(sels, cases, layers=args.layers, experts=args.experts, top_k=args.top_k, trees=args.trees,
                    repeats=args.repeats, seed=args.seed, flush_mb=args.flush_mb)
    state = f"caches flushed ({args.flush_mb} MB written) before each call" if args.flush_mb > 0 else "warm calls"
    print(f"# selection time per step: {args.layers} MoE layers, {args.experts} experts, top-{args.top_k}, "
          f"threads={torch.get_num_threads()}, {args.trees} pools x {args.repeats} calls per cell, {state}")
    print(f"{'case':<16}{'selector':<22}{'median ms':>10}{'p90 ms':>9}{'target ms':>10}{'median/target':>15}")
    for case in cases:
        target = CASES[case][3]
        for name in names:
            v = sorted(times[(case, name)])
            med, p90 = statistics.median(v), v[int(0.9 * (len(v) - 1))]
            label = name.rpartition(":")[2]
            print(f"{case:<16}{label:<22}{med:>10.3f}{p90:>9.3f}{target:>10.2f}{med / target:>14.2f}x")
    return 0
