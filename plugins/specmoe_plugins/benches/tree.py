# SPDX-License-Identifier: Apache-2.0
"""Tree vs chain at equal verified tokens, raw vs calibrated node values (``platform bench tree``).

On a target and a drafter checkpoint (``--target``, ``--drafter-path``: e.g. the demo's ``pretrain_target`` and
``train_eagle3`` stage directories) and benchmark prompts (default: 16 GSM8K test questions, zero-shot
``Question: ...\\nAnswer:``), it generates every prompt with each method, in one run, interleaved prompt by
prompt (the order rotated per prompt), and reports per method tokens per step (tokens each speculative step's
verification accepted, bonus included, before a stop rule cut a generation's last step: vLLM's mean acceptance
length; independent of the machine's load), tokens/s, the per-position acceptance (share of steps
that accepted at least d drafts), the verified tokens per step and the phase seconds per step.

Methods: ``--shapes`` name=budget/steps/top_k[/frontier] (default: chains of 3 and 4 drafts, trees at γ 4 and 5
from EAGLE-2/3's top-2 pool and from the width-1 pool, ``frontier: 1`` of the ``eagle3`` drafter), each with
every selector of ``--selectors`` ranking by raw path probabilities (``calibrated: false``, EAGLE-2/3 and the
paper) and by the engine's calibrated node values (:mod:`specmoe.decoding.node_values`, the default); a chain
(``top_k`` 1, ``budget = steps + 1``) verifies its whole pool whatever the selector, so it runs once. Each method
has its own engine for the whole run: its calibration learns across the prompts, as in an evaluation, after
``--warmup`` untimed generations of other prompts of the dataset (an evaluation cell warms each method up too), so
the calibrated trees are measured calibrated, not on their first prompt's prior. ``--verifier`` installs an experts
implementation for every method (default: the model's own). On a shared CPU machine use ``--threads 1 --clock thread``.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specmoe.interfaces.target import Target

__all__ = ["add_arguments", "run", "measure", "parse_shapes"]

DEFAULT_SHAPES = "chain3=4/3/1,chain4=5/4/1,tree4=4/3/2,tree5=5/4/2,tree4w1=4/3/2/1,tree5w1=5/4/2/1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from specmoe.bench.target import add_prompt_arguments

    p.add_argument("--target", help="checkpoint directory (default: the demo architecture, random weights)")
    p.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--drafter", default=None, help="default: the registry's default drafter")
    p.add_argument("--drafter-path", default=None, help="drafter checkpoint (default: the drafter untrained)")
    p.add_argument("--predictor", default=None,
                   help="expert predictor of the cost-aware selectors (default: the registry's default predictor)")
    p.add_argument("--predictor-path", default=None)
    p.add_argument("--selectors", default=None, help="tree selectors, each raw and calibrated (default: the "
                                                     "registry's default selector and its one that prices experts)")
    p.add_argument("--shapes", default=DEFAULT_SHAPES,
                   help="name=budget/steps/top_k[/frontier], comma-separated (frontier: the drafter's option)")
    add_prompt_arguments(p)
    p.add_argument("--warmup", type=int, default=4,
                   help="untimed generations per method before the measured prompts (other prompts of the dataset)")
    p.add_argument("--verifier", default="", help="verifier plugin installed for every method ('' = the model's own)")
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave as is)")
    p.add_argument("--clock", choices=("wall", "thread"), default="wall")
    p.add_argument("--cache-dir", default=".specmoe_cache/bench")
    p.add_argument("--json", default=None, help="also write the results to this file")


def parse_shapes(text: str) -> dict[str, tuple[int, int, int, int | None]]:
    """``"chain3=4/3/1,tree4w1=4/3/2/1"`` -> ``{name: (budget, steps, top_k, frontier or None)}``."""
    from specmoe.errors import UserError

    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        try:
            name, spec = item.split("=")
            vals = [int(v) for v in spec.split("/")]
            if len(vals) not in (3, 4):
                raise ValueError
        except ValueError:
            raise UserError(f"bench tree: --shapes entry {item!r} is not name=budget/steps/top_k[/frontier] "
                            f"(e.g. tree4=4/3/2)") from None
        if min(vals) < 1:
            raise UserError(f"bench tree: --shapes entry {item!r}: budget, steps, top_k and frontier must be >= 1")
        out[name] = (vals[0], vals[1], vals[2], vals[3] if len(vals) == 4 else None)
    if not out:
        raise UserError("bench tree: --shapes is empty")
    return out


def resolve_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the components left unset with the registry's defaults (:meth:`specmoe.registry.Registry.default`;
    ``platform ls`` marks them)."""
    from specmoe.registry import datasets, drafters, predictors, selectors

    args.drafter = args.drafter or drafters.default()
    args.predictor = args.predictor or predictors.default()
    if args.selectors is None:
        args.selectors = f"{selectors.default()},{selectors.default('experts')}"
    args.dataset = args.dataset or datasets.default()
    return args


def measure(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """Per method: tokens per step, tokens/s, acceptance per position, verified tokens and phase seconds per step."""
    import torch

    from specmoe.bench.drafters import bench_drafter
    from specmoe.bench.target import bench_prompts
    from specmoe.decoding.engine import SpeculativeEngine
    from specmoe.decoding.stopping import StopRule
    from specmoe.registry import drafters, predictors, selectors, verifiers

    resolve_defaults(args)
    if getattr(args, "verifier", ""):
        verifiers.get(args.verifier)().install(target)
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    drafter = bench_drafter(target, args)
    by_frontier: dict[int | None, Any] = {None: drafter}
    pred = predictors.get(args.predictor)(**({"path": args.predictor_path} if args.predictor_path else {}))
    pred.setup(target)
    n_warm = max(int(getattr(args, "warmup", 4)), 0)
    everything = bench_prompts(target, args, n_warm)
    prompts, warm = everything[:args.prompts], everything[args.prompts:]
    shapes = parse_shapes(args.shapes)
    chain_selector = selectors.default()  # a chain is verified whole: the plain selector, raw only
    methods: dict[str, tuple[Any, tuple[int, int, int]]] = {}
    for shape, (budget, steps, top_k, frontier) in shapes.items():
        if frontier not in by_frontier:
            opts = {"path": args.drafter_path} if args.drafter_path else {"init": {"seed": 0}}
            by_frontier[frontier] = drafters.get(args.drafter)(**opts, frontier=frontier)
            by_frontier[frontier].setup(target)
        chain = top_k == 1 and budget >= steps + 1
        for sel_name in ([chain_selector] if chain else [s for s in args.selectors.split(",") if s]):
            for calibrated in ([False] if chain else [False, True]):
                sel = selectors.get(sel_name)(calibrated=calibrated)
                name = f"{shape}/{sel_name}" if chain else f"{shape}/{sel_name}/{'cal' if calibrated else 'raw'}"
                eng = SpeculativeEngine(target, by_frontier[frontier], sel, pred if sel.needs_experts else None,
                                        clock=clock)
                methods[name] = (eng, (budget, steps, top_k))
    stop = StopRule(args.new_tokens, stop_ids=list(target.eos_token_ids))
    acc: dict[str, dict[str, Any]] = {k: {"tokens": 0, "steps": 0, "seconds": 0.0, "verified": 0, "hist": [],
                                          "t": {"draft": 0.0, "pred": 0.0, "select": 0.0, "verify": 0.0,
                                                "total": 0.0}} for k in methods}
    names = list(methods)
    for i, prompt in enumerate(warm):  # untimed: kernels warm, calibrations see the regime once
        for name in names:
            eng, (budget, steps, top_k) = methods[name]
            eng.generate([prompt], budget=budget, steps=steps, top_k=top_k, temperature=args.temperature, stop=stop,
                         seed=10_000 + i)
    for i, prompt in enumerate(prompts):
        for name in names[i % len(names):] + names[:i % len(names)]:
            eng, (budget, steps, top_k) = methods[name]
            out = eng.generate([prompt], budget=budget, steps=steps, top_k=top_k, temperature=args.temperature,
                               stop=stop, seed=i)
            a = acc[name]
            a["tokens"] += len(out.tokens[0])
            a["seconds"] += out.wall_time
            for s in out.steps:
                if not s.speculative or not s.accepted:
                    continue
                a["steps"] += 1
                # drafts the verification accepted, before a stop rule cut the generation's last step (what
                # vLLM's acceptance counters count: comparable tokens per step and acceptance by position)
                a["hist"].append((s.uncut or s.accepted)[0] - 1)
                a["verified"] += sum(s.verified)
                for ph in a["t"]:
                    a["t"][ph] += getattr(s, f"t_{ph}") or 0.0
    res: dict[str, Any] = {}
    for name, a in acc.items():
        n = max(a["steps"], 1)
        depth = max(methods[name][1][1], 1)
        res[name] = {
            "tokens_per_step": sum(h + 1 for h in a["hist"]) / n, "tok_s": a["tokens"] / max(a["seconds"], 1e-12),
            "verified_per_step": a["verified"] / n, "steps": a["steps"], "tokens": a["tokens"],
            "acceptance_by_position": [sum(h >= d for h in a["hist"]) / n for d in range(1, depth + 1)],
            "ms_per_step": {k: 1e3 * v / n for k, v in a["t"].items()}}
        eng = methods[name][0]
        if getattr(eng, "values", None) is not None:
            cal = eng.values.model.calibration(args.temperature)
            res[name]["calibration"] = {"weights": eng.values.model.weights_for(args.temperature).tolist(), **cal}
    return {"methods": res, "prompts": len(prompts), "warmup": len(warm), "threads": torch.get_num_threads(),
            "prompt_tokens": sum(len(p) for p in prompts)}


def _report(r: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [f"target: {args.target or 'demo architecture (random init)'}  drafter {args.drafter} "
             f"{args.drafter_path or '(untrained)'}  {args.dataset} x {r['prompts']} prompts (+{r['warmup']} warm-up), "
             f"{args.new_tokens} new "
             f"tokens, T={args.temperature}, batch 1, threads {r['threads']}, clock {args.clock}",
             f"{'method':<28} {'tok/step':>8} {'tok/s':>8} {'verified':>8}  accepted >= d drafts (d = 1..)"
             f"   ms/step draft / select / verify / total"]
    for name, m in r["methods"].items():
        t = m["ms_per_step"]
        lines.append(f"{name:<28} {m['tokens_per_step']:8.3f} {m['tok_s']:8.1f} {m['verified_per_step']:8.2f}  "
                     + " / ".join(f"{x:.2f}" for x in m["acceptance_by_position"])
                     + f"   {t['draft']:.2f} / {t['select']:.2f} / {t['verify']:.2f} / {t['total']:.2f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from specmoe.bench.target import run_on_target

    return run_on_target(args, "tree", measure, _report)
