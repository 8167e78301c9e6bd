# SPDX-License-Identifier: Apache-2.0
"""Verification latency vs unique experts per layer, measured on a real checkpoint (--target DIR).

Loads the checkpoint with the registry's default target plugin (a Hugging Face one: ``hf``; eager attention,
``eager`` experts: the loop over the routed experts that transformers ships), then times one verification-sized
call of ``gamma * batch`` tokens while forcing the routing so that every MoE layer touches exactly ``u``
distinct experts, for ``u`` from ``top_k`` to ``min(E, T * top_k)``. Token ``t`` slot ``j`` goes to expert
``S[(t * k + j) % u]`` of a fresh random set ``S`` per call (rows stay distinct; experts get equal loads).

``--mode experts`` (default) calls every layer's experts module directly with the forced ``top_k_index``;
``--mode model`` runs the target's verification forward (``Target.forward``: the engine's 4D-mask call,
attention over a ``--context`` prefix in the KV cache, rolled back after each call; routers overridden by
forward hooks). The ``u`` values are interleaved in a new random order every round, so machine load drifts hit
all of them alike (the goodput selector's cost-model calibration, which was ``--calibrate``, is ``platform bench
goodput_cost`` in the selector's folder; it reuses :func:`forced_routing` and :func:`override_routers`). Prints
median latency per ``u`` and a least-squares line ``ms = intercept + slope * u``; ``slope / L`` is the cost of one
more expert in one layer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

__all__ = ["add_arguments", "run", "forced_routing", "override_routers", "fit_line", "measure"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True,
                        help="checkpoint directory (save_pretrained output) or hub id")
    parser.add_argument("--gamma", type=int, default=8, help="verified tokens per sequence")
    parser.add_argument("--batch", type=int, default=1, help="sequences per call (T = gamma * batch)")
    parser.add_argument("--unions", default="all",
                        help="comma-separated u values, or 'all' (top_k .. min(E, T*top_k))")
    parser.add_argument("--mode", choices=("experts", "model"), default="experts",
                        help="time the experts modules alone, or the whole forward with forced routing")
    parser.add_argument("--context", type=int, default=128,
                        help="--mode model: tokens already in the KV cache")
    parser.add_argument("--iters", type=int, default=15, help="timed rounds (every u once per round)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (CPU); default: torch's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--calibrate", action="store_true",
                        help="moved: the goodput cost model is calibrated by 'platform bench goodput_cost'")


def forced_routing(tokens: int, top_k: int, union: int, num_experts: int, gen: Any):
    """``(top_k_index [T, k] int64, top_k_weights [T, k])`` touching exactly ``min(union, T*k)`` experts."""
    import torch

    if not top_k <= union <= num_experts:
        raise ValueError(f"union {union} must lie in [top_k={top_k}, E={num_experts}]")
    chosen = torch.randperm(num_experts, generator=gen)[:union]
    slots = torch.arange(tokens * top_k).view(tokens, top_k) % union
    weights = torch.softmax(torch.randn(tokens, top_k, generator=gen), dim=-1)
    return chosen[slots], weights


def override_routers(routers: list[Any], forced: list[tuple[Any, Any]]) -> list[Any]:
    """Forward hooks making router ``i`` return ``forced[i] = (top_k_index, top_k_weights)`` (read at call
    time, so the list can be refilled between calls). Returns the hook handles (``.remove()`` them)."""
    def override(i: int):
        def hook(module: Any, args: tuple, out: Any):
            if not (isinstance(out, tuple) and len(out) == 3):
                raise TypeError(f"{type(module).__name__} does not return (logits, weights, indices)")
            idx, w = forced[i]
            return out[0], w.to(device=out[1].device, dtype=out[1].dtype), idx.to(out[2].device)
        return hook

    return [r.register_forward_hook(override(i)) for i, r in enumerate(routers)]


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares ``y = a + b x``; returns ``(a, b, r2)``."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    return a, b, (1.0 - ss_res / ss_tot) if ss_tot else 1.0


def measure(target: Any, unions: list[int], *, gamma: int = 8, batch: int = 1, mode: str = "experts",
            context: int = 128, iters: int = 15, warmup: int = 2, seed: int = 0) -> dict[int, list[float]]:
    """Milliseconds of each timed call, per union size ``u`` (see the module docstring)."""
    import random

    import torch

    from specmoe.decoding.clock import device_sync
    from specmoe.interfaces.kv import KVState

    dev = target.device
    experts, routers = target.experts_modules(), target.routers()
    n_tok, k, n_exp, hid = gamma * batch, target.top_k, target.num_experts, target.hidden_size
    gen = torch.Generator().manual_seed(seed)
    order_rng = random.Random(seed)
    forced: list[tuple[Any, Any]] = []
    hooks, kv, step_ids, step_pos = [], None, None, None
    if mode == "model":
        hooks = override_routers(routers, forced)
        ctx_ids = torch.randint(0, target.vocab_size, (batch, context), generator=gen).to(dev)
        step_ids = torch.randint(0, target.vocab_size, (batch, gamma), generator=gen).to(dev)
        step_pos = (context + torch.arange(gamma, device=dev)).expand(batch, gamma)
        kv = KVState(batch, dev)
        forced[:] = [forced_routing(batch * context, k, k, n_exp, gen) for _ in routers]  # any routing
        target.forward(ctx_ids, kv, torch.arange(context, device=dev).expand(batch, context))
    hidden = torch.randn(n_tok, hid, generator=gen).to(dev, target.dtype)
    times: dict[int, list[float]] = {u: [] for u in unions}
    try:
        for rnd in range(warmup + iters):
            order = list(unions)
            order_rng.shuffle(order)
            for u in order:
                forced[:] = [forced_routing(n_tok, k, u, n_exp, gen) for _ in experts]
                routing = [(i.to(dev), w.to(dev, target.dtype)) for i, w in forced]
                device_sync(dev)
                t0 = time.perf_counter()
                with torch.no_grad():
                    if mode == "model":  # the engine's verification call: 4D mask over the KV cache
                        target.forward(step_ids, kv, step_pos)
                    else:
                        for mod, (idx, w) in zip(experts, routing):
                            mod(hidden, idx, w)
                device_sync(dev)
                dt = (time.perf_counter() - t0) * 1e3
                if mode == "model":
                    kv.drop_last(gamma)
                if rnd >= warmup:
                    times[u].append(dt)
    finally:
        for h in hooks:
            h.remove()
    return times


def run(args: argparse.Namespace) -> int:
    import torch

    from specmoe.errors import UserError
    from specmoe.registry import targets

    if args.calibrate:
        raise UserError("--calibrate moved: the goodput cost model is calibrated by 'platform bench goodput_cost "
                        "--target DIR' (the same options; see 'platform bench goodput_cost --help')")
    if args.threads:
        torch.set_num_threads(args.threads)
    target = targets.get(targets.default())(path=args.target, device=args.device, dtype=args.dtype,
                               attn_implementation="eager")
    target.set_experts_implementation("eager")
    k, n_exp, n_layers = target.top_k, target.num_experts, len(target.moe_layer_ids)
    n_tok = args.gamma * args.batch
    top = min(n_exp, n_tok * k)
    unions = list(range(k, top + 1)) if args.unions == "all" else [int(u) for u in args.unions.split(",")]
    if not unions or min(unions) < k or max(unions) > top:
        raise UserError(f"--unions must lie in [{k}, {top}] (top_k .. min(E, T*top_k)), got {args.unions}")
    times = measure(target, unions, gamma=args.gamma, batch=args.batch, mode=args.mode, context=args.context,
                    iters=args.iters, warmup=args.warmup, seed=args.seed)
    med = {u: statistics.median(v) for u, v in times.items()}
    a, b, r2 = fit_line([float(u) for u in unions], [med[u] for u in unions])
    per_layer_slope = b / n_layers
    mb = target.bytes_per_expert / 1e6
    print(f"# {args.target}: {n_layers} MoE layers, E={n_exp}, top-{k}, {mb:.2f} MB/expert "
          f"({target.dtype}), T={n_tok} tokens, mode={args.mode}, threads={torch.get_num_threads()}, "
          f"{args.iters} rounds")
    print(f"{'u':>4} {'median ms':>10} {'p10':>8} {'p90':>8} {'ms/layer':>9} {'fit':>8}")
    for u in unions:
        v = sorted(times[u])
        p10, p90 = v[int(0.1 * (len(v) - 1))], v[int(0.9 * (len(v) - 1))]
        print(f"{u:>4} {med[u]:>10.3f} {p10:>8.3f} {p90:>8.3f} {med[u] / n_layers:>9.3f} {a + b * u:>8.3f}")
    gbs = mb / 1e3 / (per_layer_slope / 1e3) if per_layer_slope > 0 else float("nan")
    print(f"fit: ms = {a:.3f} + {b:.4f} * u   (R^2 {r2:.3f}); per expert-layer {per_layer_slope:.4f} ms "
          f"(= {gbs:.1f} GB/s of expert weights); intercept per layer {a / n_layers:.3f} ms")
    lo, hi = min(unions), max(unions)
    print(f"u={hi} / u={lo}: {med[hi] / med[lo]:.2f}x")
    if args.json:
        result = dict(target=args.target, mode=args.mode, tokens=n_tok, layers=n_layers, experts=n_exp,
                      top_k=k, bytes_per_expert=target.bytes_per_expert, threads=torch.get_num_threads(),
                      median_ms={str(u): med[u] for u in unions}, intercept_ms=a, slope_ms_per_u=b,
                      slope_ms_per_expert_layer=per_layer_slope, r2=r2)
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0
