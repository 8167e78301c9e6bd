# SPDX-License-Identifier: Apache-2.0
"""Decoding-loop overhead: ``ar`` vs ``model.generate`` tokens/s, and the speculative engine's per-step
overhead (step time minus draft, predictor and verify time) as a fraction of the step."""

from __future__ import annotations

import argparse
import statistics
import time

__all__ = ["add_arguments", "run", "measure"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="checkpoint directory (default: a tiny random model, see --arch)")
    p.add_argument("--arch", default="gpt_oss", help="tiny architecture when --target is not given")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budget", type=int, default=4)
    p.add_argument("--selector", default="ecospec")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave as is)")
    p.add_argument("--cache-dir", default=".specmoe_cache/bench")


def measure(target, *, prompt_len: int, new_tokens: int, repeats: int, budget: int, selector: str) -> dict:
    """Run the three measurements interleaved (same load for each) and return medians."""
    import torch

    from specmoe.decoding.ar import ar_generate
    from specmoe.decoding.engine import SpeculativeEngine
    from specmoe.decoding.stopping import StopRule
    from specmoe.registry import drafters, predictors, selectors

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.vocab_size, (prompt_len,), generator=g).tolist()
    stop = StopRule(new_tokens)  # no stop ids: every method generates exactly new_tokens tokens
    drafter = drafters.get("draft_model")(share_target=True)
    drafter.setup(target)
    sel = selectors.get(selector)()
    pred = None
    if sel.needs_experts:
        pred = predictors.get("router_on_embedding")()
        pred.setup(target)
    engine = SpeculativeEngine(target, drafter, sel, pred)
    ids = torch.tensor([prompt], device=target.device)

    def hf_generate() -> float:
        t0 = time.perf_counter()
        out = target.native_generate(ids, new_tokens)
        if out is None:
            raise ValueError(f"target {type(target).__name__} has no native generate loop to compare with")
        return (out.shape[1] - ids.shape[1]) / (time.perf_counter() - t0)

    def ours() -> float:
        gen = ar_generate(target, [prompt], temperature=0, stop=stop, capture_routing=True)
        return len(gen.tokens[0]) / gen.wall_time

    steps = []
    ar_tps, hf_tps = [], []
    for _ in range(repeats + 1):  # the first round is a warm-up
        hf_tps.append(hf_generate())
        ar_tps.append(ours())
        gen = engine.generate([prompt], budget=budget, steps=3, top_k=2, temperature=0, stop=stop)
        steps.append(gen.steps)
    hf_tps, ar_tps, steps = hf_tps[1:], ar_tps[1:], [s for run in steps[1:] for s in run]
    tot = sum(s.t_total for s in steps)
    parts = {k: sum(getattr(s, k) for s in steps) / tot for k in ("t_draft", "t_pred", "t_select", "t_verify")}
    return {"hf_generate_tok_s": statistics.median(hf_tps), "ar_tok_s": statistics.median(ar_tps),
            "ar_vs_generate": statistics.median(ar_tps) / statistics.median(hf_tps),
            "step_ms": 1000 * tot / len(steps), **{f"frac_{k[2:]}": v for k, v in parts.items()},
            "frac_overhead": 1 - parts["t_draft"] - parts["t_pred"] - parts["t_verify"],
            "frac_overhead_excl_select": 1 - sum(parts.values())}


def run(args: argparse.Namespace) -> int:
    import torch

    from specmoe.registry import targets

    if args.threads:
        torch.set_num_threads(args.threads)
    hf = targets.get("hf")
    target = hf(path=args.target) if args.target else hf(tiny={"arch": args.arch}, cache_dir=args.cache_dir)
    r = measure(target, prompt_len=args.prompt_len, new_tokens=args.new_tokens, repeats=args.repeats,
                budget=args.budget, selector=args.selector)
    print(f"target: {args.target or 'tiny ' + args.arch}  prompt {args.prompt_len}  new tokens {args.new_tokens}  "
          f"repeats {args.repeats} (medians)")
    print(f"{'model.generate':<28}{r['hf_generate_tok_s']:>10.1f} tok/s")
    print(f"{'ar (specmoe)':<28}{r['ar_tok_s']:>10.1f} tok/s   ratio ar/generate = {r['ar_vs_generate']:.3f}")
    print(f"speculative step ({args.selector}, gamma={args.budget}): {r['step_ms']:.2f} ms")
    for k in ("draft", "pred", "select", "verify"):
        print(f"  {k:<10}{100 * r['frac_' + k]:>6.1f} %")
    print(f"  overhead (step - draft - pred - verify): {100 * r['frac_overhead']:.1f} % "
          f"(of which selection {100 * r['frac_select']:.1f} %)")
    return 0
