# SPDX-License-Identifier: Apache-2.0
"""goodput vs AR vs every fixed γ, end to end in one run (``platform bench goodput``).

On a target (default: the demo architecture with random weights; ``--target`` for a trained one) and a drafter
(default: an untrained EAGLE-3, or ``--drafter-path``), it generates the same prompts with AR, with confidence
selection at every fixed γ of ``--gammas``, with token-only goodput and with goodput (γ_max = the largest γ),
interleaved round by round (the first round is a warm-up), and reports per method the median tokens/s over
rounds and its ratio to AR, goodput's ratio to the best fixed γ, the share of steps goodput took as plain AR
steps (its AR floor), its cost model's held-out median error of T_verify (each pass predicted before it was
observed; warm-up round excluded) and its acceptance model's calibration (ECE). The goodput selectors keep
learning across rounds, as they would across the prompts of an evaluation. On a shared CPU machine use
``--threads 1 --clock thread``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

__all__ = ["add_arguments", "run", "measure"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="checkpoint directory (default: the demo architecture, random weights)")
    p.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--drafter", default="eagle3",
                   help="a registered drafter (`platform ls drafters`); untrained unless --drafter-path, or drafting "
                        "with the target itself where the drafter has a share_target option")
    p.add_argument("--drafter-path", default=None)
    p.add_argument("--predictor", default="router_on_embedding", help="goodput's expert predictor")
    p.add_argument("--predictor-path", default=None)
    p.add_argument("--gammas", default="2,3,4,5,6,7,8", help="fixed γ values (confidence selection)")
    p.add_argument("--goodput", default="{}", help="goodput selector options as JSON (e.g. a cost_model path)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (after one warm-up round)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave as is)")
    p.add_argument("--clock", choices=("wall", "thread"), default="wall")
    p.add_argument("--cache-dir", default=".specmoe_cache/bench")
    p.add_argument("--json", default=None, help="also write the results to this file")


def measure(target: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Median tokens/s per method and goodput's floor share, cost and acceptance errors."""
    import torch

    from specmoe.bench.drafters import bench_drafter
    from specmoe.decoding.ar import ar_generate
    from specmoe.decoding.engine import SpeculativeEngine
    from specmoe.decoding.stopping import StopRule
    from specmoe.registry import predictors, selectors
    from specmoe_plugins.selectors.goodput.selector import GoodputSelector

    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    drafter = bench_drafter(target, args)
    pred = predictors.get(args.predictor)(**({"path": args.predictor_path} if args.predictor_path else {}))
    pred.setup(target)
    gammas = [int(g) for g in args.gammas.split(",") if g]
    try:
        opts = json.loads(args.goodput)
    except json.JSONDecodeError as exc:
        from specmoe.errors import UserError

        raise UserError(f"bench goodput: --goodput must be a JSON object of selector options ({exc})") from exc
    engines: dict[str, tuple[Any, int]] = {
        f"confidence@{g}": (SpeculativeEngine(target, drafter, selectors.get("confidence")(), clock=clock), g)
        for g in gammas}
    tok_sel = GoodputSelector(**{**opts, "expert_cost": False})
    good_sel = GoodputSelector(**opts)
    engines[f"goodput_tokens@{max(gammas)}"] = (SpeculativeEngine(target, drafter, tok_sel, clock=clock), max(gammas))
    engines[f"goodput@{max(gammas)}"] = (SpeculativeEngine(target, drafter, good_sel, pred, clock=clock), max(gammas))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, target.vocab_size, (args.prompt_len,), generator=g).tolist()
               for _ in range(args.prompts)]
    batches = [prompts[i:i + args.batch] for i in range(0, len(prompts), args.batch)]
    stop = StopRule(args.new_tokens)  # no stop ids: every method generates exactly new_tokens per row
    tps: dict[str, list[float]] = {"ar": [], **{k: [] for k in engines}}
    ar_share: dict[str, list[float]] = {k: [] for k in engines}
    for rnd in range(args.repeats + 1):
        names = ["ar", *engines]
        names = names[rnd % len(names):] + names[:rnd % len(names)]  # rotated: nobody always runs first
        if rnd == 1:  # held-out errors of the timed rounds only
            for sel in (tok_sel, good_sel):
                sel.cost.reset_heldout()
        for name in names:
            tokens = seconds = steps = ar_steps = 0
            for i, batch in enumerate(batches):
                kw = dict(temperature=args.temperature, stop=stop, seed=1000 * rnd + i)
                if name == "ar":
                    out = ar_generate(target, batch, clock=clock, **kw)
                else:
                    eng, gamma = engines[name]
                    out = eng.generate(batch, budget=gamma, steps=3, top_k=2, **kw)
                    steps += len(out.steps)
                    ar_steps += sum(not s.speculative for s in out.steps)
                tokens += sum(len(t) for t in out.tokens)
                seconds += out.wall_time
            if rnd:
                tps[name].append(tokens / seconds)
                if name != "ar":
                    ar_share[name].append(ar_steps / max(steps, 1))
    med = {k: statistics.median(v) for k, v in tps.items()}
    fixed = {k: v for k, v in med.items() if k.startswith("confidence@")}
    best = max(fixed, key=fixed.get)
    good, tok = f"goodput@{max(gammas)}", f"goodput_tokens@{max(gammas)}"
    cal = good_sel.calibration()
    acc = cal["acceptance"].get(str(0.0 if args.temperature <= 0 else round(args.temperature, 3)), {})
    return {"tok_s": med, "vs_ar": {k: v / med["ar"] for k, v in med.items()}, "best_fixed": best,
            "goodput_vs_best_fixed": med[good] / med[best], "goodput_tokens_vs_best_fixed": med[tok] / med[best],
            "ar_step_share": {k: statistics.mean(v) for k, v in ar_share.items() if k.startswith("goodput")},
            "cost_heldout": cal["cost"]["heldout"], "cost_window": {k: cal["cost"][k] for k in
                                                                    ("median_abs_rel_error", "n")},
            "cost_coef": cal["cost"]["coef"], "acceptance_ece": acc.get("ece"), "acceptance_n": acc.get("n"),
            "ar_floor": dict(engines[good][0].floor.counts), "threads": torch.get_num_threads()}


def _report(r: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [f"target: {args.target or 'demo architecture (random init)'}  drafter {args.drafter}"
             f"{' ' + args.drafter_path if args.drafter_path else ' (untrained)'}  T={args.temperature}  "
             f"batch {args.batch}  prompts {args.prompts} x {args.new_tokens} new tokens  rounds {args.repeats} "
             f"(+1 warm-up)  threads {r['threads']}  clock {args.clock}"]
    for k, v in r["tok_s"].items():
        floor = f"  AR steps {100 * r['ar_step_share'][k]:.0f} %" if k in r["ar_step_share"] else ""
        lines.append(f"  {k:<20} {v:8.1f} tok/s  {r['vs_ar'][k]:.3f}x AR{floor}")
    h = r["cost_heldout"]
    lines += [f"best fixed γ: {r['best_fixed']}; goodput / best fixed {r['goodput_vs_best_fixed']:.3f}x, "
              f"token-only goodput / best fixed {r['goodput_tokens_vs_best_fixed']:.3f}x",
              f"goodput cost model: held-out median |error| of T_verify {100 * h['median_abs_rel_error']:.1f} % "
              f"(p90 {100 * h['p90_abs_rel_error']:.1f} %, {h['n']} passes), in-window "
              f"{100 * r['cost_window']['median_abs_rel_error']:.1f} %; coefficients "
              + ", ".join(f"{k} {v:.3g}" for k, v in r["cost_coef"].items()),
              f"goodput acceptance model: ECE {r['acceptance_ece']} over {r['acceptance_n']} nodes; AR floor "
              f"decisions {r['ar_floor']}"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from specmoe.bench.target import run_on_target

    return run_on_target(args, "goodput", measure, _report)
