# SPDX-License-Identifier: Apache-2.0
"""goodput's cost model calibrated on a checkpoint and saved as JSON (``platform bench goodput_cost --target DIR``).

Sweeps rows x cached context x tokens per row x expert-union sizes through the target's verification call with
forced routing (:mod:`.calibration`), fits the cost model on part of the calls and reports its error on the rest,
then saves ``cost_model.json`` (a goodput selector's ``cost_model:`` option). This was ``platform bench
expert_latency --calibrate``; the timing of one expert union at a time stays there (a generic measurement).
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from specmoe_plugins.selectors.goodput.cost_model import DEFAULT_FEATURES

    parser.add_argument("--target", required=True, help="checkpoint directory (save_pretrained output) or hub id")
    parser.add_argument("--target-plugin", default="hf",
                        help="the target plugin that loads it (`platform ls target`); eager attention and experts")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (CPU); default: torch's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iters", type=int, default=15, help="timed rounds (every configuration once per round)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--gammas", default="1,2,4,8", help="tokens per row")
    parser.add_argument("--batches", default="1,2,4", help="rows per call")
    parser.add_argument("--contexts", default="64,256,512", help="cached tokens per row")
    parser.add_argument("--unions-per-t", type=int, default=3, help="union sizes per token count")
    parser.add_argument("--features", action="append", default=None,
                        help="comma-separated cost-model features (cost_model.FEATURES); repeat to compare sets on "
                             "the same calls (the first is saved); default: " + ",".join(DEFAULT_FEATURES))
    parser.add_argument("--holdout", type=float, default=0.25, help="fraction of calls held out of the fit")
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall",
                        help="wall clock (what the engine measures) or this thread's CPU time (shared CPU machines)")
    parser.add_argument("--save", default=None,
                        help="cost model JSON file or directory (default: cost_model.json beside a local --target)")
    parser.add_argument("--check-steps", type=int, default=0,
                        help="then run this many speculative generations and report the error on their steps")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _output(args: argparse.Namespace) -> Path:
    from specmoe.errors import UserError

    save = args.save
    if save is None:
        if not Path(args.target).is_dir():
            raise UserError("--save: give a file or directory for the cost model (the target is not a local dir)")
        save = args.target
    return Path(save) / "cost_model.json" if Path(save).is_dir() or not str(save).endswith(".json") else Path(save)


def run(args: argparse.Namespace) -> int:
    import torch

    from specmoe.errors import UserError
    from specmoe.registry import targets
    from specmoe_plugins.selectors.goodput.calibration import calibrate, engine_check, fit_split, grid
    from specmoe_plugins.selectors.goodput.cost_model import DEFAULT_FEATURES, FEATURES

    feature_sets = [[f for f in text.split(",") if f] for text in args.features or [",".join(DEFAULT_FEATURES)]]
    bad = [f for fs in feature_sets for f in fs if f not in FEATURES]
    if bad:
        raise UserError(f"--features: unknown {', '.join(bad)}; choose from {', '.join(FEATURES)}")
    out = _output(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = targets.get(args.target_plugin)(path=args.target, device=args.device, dtype=args.dtype,
                                             attn_implementation="eager")
    target.set_experts_implementation("eager")
    layers = len(target.moe_layer_ids)
    configs = grid(target.top_k, target.num_experts, _ints(args.gammas), _ints(args.batches), _ints(args.contexts),
                   args.unions_per_t)
    records = calibrate(target, configs, iters=args.iters, warmup=args.warmup, seed=args.seed, clock=args.clock)
    print(f"# {args.target}: {layers} MoE layers, E={target.num_experts}, top-{target.top_k}, {target.dtype}, "
          f"device {target.device}, threads={torch.get_num_threads()}, clock={args.clock}; {len(configs)} "
          f"configurations x {args.iters} rounds = {len(records)} calls, {args.holdout:.0%} held out")
    fits = [fit_split(records, layers, fs, args.holdout, args.seed) for fs in feature_sets]
    for fit_model, train_err, held_err in fits:
        print("T_verify = " + " + ".join(f"{c * 1e3:.4g} ms * {f}" for f, c in fit_model.coefficients().items()))
        for name, err in (("train", train_err), ("held-out calls", held_err)):
            print(f"  {name:<16} median |rel err| {err['median_abs_rel_error']:.3f}  "
                  f"p90 {err['p90_abs_rel_error']:.3f}  (n={err['n']})")
    model, train_err, held_err = fits[0]
    model.meta.update(target=str(args.target), device=str(target.device), dtype=str(target.dtype), layers=layers,
                      experts=target.num_experts, top_k=target.top_k, clock=args.clock,
                      threads=torch.get_num_threads(), created=datetime.datetime.now().isoformat(timespec="seconds"),
                      fit={"train": train_err, "heldout_calls": held_err})
    if args.check_steps:
        errs = engine_check(target, model, generations=args.check_steps, seed=args.seed + 1)
        model.meta["fit"]["engine_steps"] = errs
        if args.clock != "wall":
            print("(engine steps are timed by the wall clock; the fit used --clock thread)")
        for name, err in errs.items():
            print(f"  {'engine, ' + name:<16} median |rel err| {err['median_abs_rel_error']:.3f}  "
                  f"p90 {err['p90_abs_rel_error']:.3f}  (n={err['n']})")
    print(f"saved {model.save(out)} (features {', '.join(model.features)})")
    return 0
