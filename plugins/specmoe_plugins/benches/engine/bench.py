# SPDX-License-Identifier: Apache-2.0
"""A speculative step against its memory roofline (``platform bench engine``).

On the demo architecture (default: a random-init GPT-OSS with the demo's shapes; ``--target`` for a trained one)
it measures, in one run:

* the device's read bandwidth, and per speculative step the bytes its verification must read (dense weights,
  the union of routed experts, the KV cache; :mod:`.roofline`) and the drafter's / predictor's own
  reads: T_verify / roofline, and the whole step / (verification + drafter + predictor) roofline;
* the phases of a step (draft, predictor, selection, verification, the rest = engine overhead) as fractions;
* aten operations and host synchronisations per step, by phase (:mod:`specmoe.bench.opcount`; a separate run);
* ``ar`` tokens/s against ``model.generate`` on the same model and prompt (interleaved);
* the cost of pruning the KV cache after acceptance at two context lengths (should not depend on it);
* the verification pass with every experts implementation (``--verifiers``), to pick the fastest per device.

Timings are medians over ``--repeats`` interleaved rounds after a warm-up round. On a shared CPU machine use
``--threads 1 --clock thread`` (this thread's CPU time: other processes' load does not count).
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

from specmoe.bench.target import DEMO, run_on_target

if TYPE_CHECKING:
    from specmoe.bench.opcount import OpCounts
    from specmoe.decoding.engine import SpeculativeEngine
    from specmoe.interfaces.drafter import Drafter
    from specmoe.interfaces.predictor import Predictor
    from specmoe.interfaces.target import Target
    from specmoe.interfaces.verifier import Verifier

__all__ = ["add_arguments", "run", "measure", "count_step_ops", "verifier_times", "DEMO", "run_on_target"]

_PHASES = ("draft", "pred", "select", "verify", "rest")  # "analysis" (after the timed region) is not counted


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="checkpoint directory (default: the demo architecture, random weights)")
    p.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    p.add_argument("--dtype", default="float32", help="target dtype (float32, bfloat16; GPUs: bfloat16)")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budget", type=int, default=4, help="gamma: verified nodes per step")
    p.add_argument("--drafter", default=None,
                   help="a registered drafter (default: the registry's default drafter; untrained unless "
                        "--drafter-path, drafting with the target where it has a share_target option)")
    p.add_argument("--drafter-path", default=None, help="a trained drafter checkpoint")
    p.add_argument("--selector", default=None, help="default: the registry's default selector that prices experts")
    p.add_argument("--predictor", default=None, help="default: the registry's default predictor")
    p.add_argument("--predictor-path", default=None, help="a trained predictor's checkpoint")
    p.add_argument("--verifier", default=None, help="default: the registry's default union verifier")
    p.add_argument("--verifiers", default=None,
                   help="experts implementations to time on the verification pass (default: the registry's default "
                        "verifier and union verifier; on CUDA also its CUDA one)")
    p.add_argument("--prune-contexts", default="256,2048")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave as is)")
    p.add_argument("--clock", choices=("wall", "thread"), default="wall",
                   help="host clock on CPU: wall, or this thread's CPU time (shared machines; needs --threads 1)")
    p.add_argument("--cache-dir", default=".specmoe_cache/bench")
    p.add_argument("--json", default=None, help="also write the results to this file")


def resolve_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the components left unset with the registry's defaults (:meth:`specmoe.registry.Registry.default`;
    ``platform ls`` marks them)."""
    from specmoe.registry import drafters, predictors, selectors, verifiers

    args.drafter = args.drafter or drafters.default()
    args.selector = args.selector or selectors.default("experts")
    args.predictor = args.predictor or predictors.default()
    args.verifier = args.verifier or verifiers.default("union")
    if args.verifiers is None:
        args.verifiers = f"{verifiers.default()},{verifiers.default('union')}"
    return args


def _components(target: Target, args: argparse.Namespace):
    from specmoe.bench.drafters import bench_drafter
    from specmoe.registry import predictors, selectors

    drafter = bench_drafter(target, args)
    sel = selectors.get(args.selector)()
    pred = None
    if sel.needs_experts:
        opts = {"path": args.predictor_path} if args.predictor_path else {}
        pred = predictors.get(args.predictor)(**opts)
        pred.setup(target)
    return drafter, sel, pred


def _own_modules(obj: Drafter | Predictor | None, target: Target) -> list:
    """The torch modules a drafter / predictor holds (its network), not the target's."""
    import torch

    if obj is None:
        return []
    target_ids = {id(m) for m in getattr(target, "model", torch.nn.Module()).modules()}
    out = []
    for v in vars(obj).values():
        if isinstance(v, torch.nn.Module) and id(v) not in target_ids:
            out.append(v)
    return out


class _Phases:
    """Wraps the engine's components so that op counts are attributed to the phase that ran them."""

    def __init__(self, counts: OpCounts) -> None:
        self.counts = counts
        self.stack = ["rest"]

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.stack[-1] != "rest":  # nested (a drafter running the target): the outer phase keeps it
            name = self.stack[-1]
        self.stack.append(name)
        self.counts.phase = name
        try:
            yield
        finally:
            self.stack.pop()
            self.counts.phase = self.stack[-1]

    def wrap(self, obj: Any, method: str, name: str) -> Callable[[], None]:
        original = getattr(obj, method)

        def wrapped(*a: Any, **kw: Any) -> Any:
            with self.phase(name):
                return original(*a, **kw)

        setattr(obj, method, wrapped)
        return lambda: delattr(obj, method) if method in vars(obj) else None


def count_step_ops(engine: SpeculativeEngine, prompt: list[int], new_tokens: int, budget: int) -> dict[str, Any]:
    """Aten ops and host syncs per step, per phase (a generation minus its prefill-only twin)."""
    from specmoe.bench.opcount import count_ops
    from specmoe.decoding.stopping import StopRule

    def run(n: int):
        with count_ops() as c:
            phases = _Phases(c)
            c.phase = "rest"
            undo = [phases.wrap(engine.drafter, "draft", "draft"),
                    phases.wrap(engine.selector, "select", "select"),
                    phases.wrap(engine.target, "forward", "verify"),
                    phases.wrap(engine, "_analyse", "analysis")]
            if engine.values is not None:  # the node values the selector ranks by: the selection's work
                undo.append(phases.wrap(engine.values, "values", "select"))
            if engine.predictor is not None:
                undo += [phases.wrap(engine.predictor, "observe", "pred"),
                         phases.wrap(engine.predictor, "predict", "pred")]
            try:
                gen = engine.generate([prompt], budget=budget, steps=3, top_k=2, temperature=0, stop=StopRule(n))
            finally:
                for u in undo:
                    u()
        return c, len(gen.steps)

    base, _ = run(1)
    full, steps = run(new_tokens)
    out: dict[str, Any] = {"steps": steps}
    for kind in ("ops", "syncs"):
        per = {}
        for ph in _PHASES:
            a = sum(v for (p, _), v in getattr(full, "by_phase_" + kind).items() if p == ph)
            b = sum(v for (p, _), v in getattr(base, "by_phase_" + kind).items() if p == ph)
            per[ph] = (a - b) / max(steps, 1)
        out[kind] = per
    syncs = {}
    for (ph, name), v in full.by_phase_syncs.items():
        d = v - base.by_phase_syncs.get((ph, name), 0)
        if d:
            syncs[f"{ph}:{name}"] = d / max(steps, 1)
    out["sync_kinds"] = syncs
    return out


def measure(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of the module docstring; returns a flat dict of results."""
    import torch

    from specmoe.decoding.ar import ar_generate
    from specmoe.decoding.engine import SpeculativeEngine
    from specmoe.decoding.stopping import StopRule
    from specmoe.registry import verifiers
    from specmoe_plugins.benches.engine import roofline
    from specmoe_plugins.benches.engine.breakdown import verify_breakdown

    resolve_defaults(args)
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    dev = target.device
    verifiers.get(args.verifier)().install(target)
    drafter, sel, pred = _components(target, args)
    engine = SpeculativeEngine(target, drafter, sel, pred, clock=clock)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.vocab_size, (args.prompt_len,), generator=g).tolist()
    stop = StopRule(args.new_tokens)  # no stop ids: every method generates exactly new_tokens tokens
    ids = torch.tensor([prompt], device=dev)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def hf_generate() -> float:
        sync()
        t0 = clock()
        out = target.native_generate(ids, args.new_tokens)
        sync()
        if out is None:
            raise ValueError(f"target {type(target).__name__} has no native generate loop to compare with")
        return (out.shape[1] - ids.shape[1]) / (clock() - t0)

    def ours() -> float:
        gen = ar_generate(target, [prompt], temperature=0, stop=stop, capture_routing=True, clock=clock)
        return len(gen.tokens[0]) / gen.wall_time

    bw = roofline.read_bandwidth(dev, clock)
    runs, ar_tps, hf_tps = [], [], []
    for _ in range(args.repeats + 1):  # the first round is a warm-up
        hf_tps.append(hf_generate())
        ar_tps.append(ours())
        runs.append(engine.generate([prompt], budget=args.budget, steps=3, top_k=2, temperature=0, stop=stop))
    bw = statistics.median([bw, roofline.read_bandwidth(dev, clock)])
    steps = [s for gen in runs[1:] for s in gen.steps]

    # ---- bytes and rooflines
    kv = target.new_kv(1, 8)
    target.forward(ids[:, :4], kv, torch.arange(4, device=dev)[None])
    slot_bytes = roofline.kv_bytes_per_slot(kv)
    dense = roofline.target_dense_bytes(target)
    ctx = args.prompt_len + args.new_tokens / 2  # mean cached context over a generation
    v_bytes = statistics.mean(roofline.verify_bytes(dense, s.pass_experts_per_layer, target.bytes_per_expert,
                                                    int(ctx), slot_bytes) for s in steps)
    d_bytes = 3 * roofline.module_bytes(_own_modules(drafter, target))  # `steps` draft forwards per step
    p_bytes = 2 * roofline.module_bytes(_own_modules(pred, target))  # observe + predict
    med = {k: statistics.median(getattr(s, k) for s in steps) for k in
           ("t_draft", "t_pred", "t_select", "t_verify", "t_total")}
    tot = sum(s.t_total for s in steps)
    frac = {k: sum(getattr(s, k) for s in steps) / tot for k in ("t_draft", "t_pred", "t_select", "t_verify")}
    r: dict[str, Any] = dict(
        device=str(dev), threads=torch.get_num_threads(), clock=args.clock, read_gb_s=bw / 1e9,
        steps=len(steps), alpha=statistics.mean(a for s in steps for a in s.accepted),
        E=statistics.mean(s.unique_experts for s in steps), verify_mb=v_bytes / 1e6, drafter_mb=d_bytes / 1e6,
        predictor_mb=p_bytes / 1e6, roofline_verify_ms=1e3 * v_bytes / bw,
        roofline_step_ms=1e3 * (v_bytes + d_bytes + p_bytes) / bw,
        **{f"{k}_ms": 1e3 * v for k, v in med.items()}, **{f"frac_{k[2:]}": v for k, v in frac.items()})
    r["verify_over_roofline"] = r["t_verify_ms"] / r["roofline_verify_ms"]
    r["step_over_roofline"] = r["t_total_ms"] / r["roofline_step_ms"]
    r["frac_overhead"] = 1 - frac["t_draft"] - frac["t_pred"] - frac["t_verify"]
    r.update(hf_generate_tok_s=statistics.median(hf_tps[1:]), ar_tok_s=statistics.median(ar_tps[1:]))
    r["ar_vs_generate"] = r["ar_tok_s"] / r["hf_generate_tok_s"]

    # ---- op and sync counts (separate run: counting is slow)
    r["counts"] = count_step_ops(engine, prompt, min(args.new_tokens, 24), args.budget)

    # ---- pruning cost vs context length
    r["prune_us"] = {c: 1e6 * roofline.prune_cost(target, c, clock=clock)
                     for c in (int(x) for x in args.prune_contexts.split(",") if x)}

    # ---- the verification pass with every experts implementation, and where the pass spends its time
    r["verifiers"] = verifier_times(target, args, clock, slot_bytes, dense, bw)
    verifiers.get(args.verifier)().install(target)
    r["breakdown"] = verify_breakdown(target, context=args.prompt_len, tokens=args.budget,
                                      repeats=5 * args.repeats, clock=clock)
    return r


def verifier_times(target: Target, args: argparse.Namespace, clock: Callable[[], float], slot_bytes: int,
                   dense: int, bw: float) -> dict[str, dict[str, float]]:
    """Median ms of one verification pass (``budget`` tokens, a chain, ``prompt_len`` cached) per experts
    implementation, with its roofline ratio (same routing for all)."""
    import torch

    from specmoe.decoding.analysis import experts_per_layer
    from specmoe.interfaces.tree import DraftTree
    from specmoe.registry import verifiers
    from specmoe_plugins.benches.engine import roofline

    dev = target.device
    names = [n for n in args.verifiers.split(",") if n]
    if dev.type == "cuda" and verifiers.default("cuda") not in names:
        names.append(verifiers.default("cuda"))
    gen = torch.Generator().manual_seed(1)
    kv = target.new_kv(1, args.prompt_len + args.budget)
    ctx = torch.randint(0, target.vocab_size, (1, args.prompt_len), generator=gen).to(dev)
    target.forward(ctx, kv, torch.arange(args.prompt_len, device=dev)[None])
    n = args.budget
    tree = DraftTree.from_lists(list(range(1, n + 1)), list(range(-1, n - 1)), device=dev)
    toks = torch.randint(0, target.vocab_size, (1, n), generator=gen).to(dev)
    out: dict[str, dict[str, float]] = {}
    for name in names:
        try:
            _verifier(name).install(target)
        except Exception as exc:  # noqa: BLE001 - a missing extra (triton) is reported, the rest measured
            out[name] = {"error": str(exc).splitlines()[0]}
            continue
        times, e_layers = [], None
        for i in range(args.repeats * 5 + 2):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = clock()
            o = target.forward(toks, kv, args.prompt_len + tree.depth, tree.ancestors(), tree.valid,
                               capture_routing=True)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            if i >= 2:
                times.append(clock() - t0)
            e_layers = experts_per_layer(o.routing, tree.valid, target.num_experts)
            kv.drop_last(n)
        b = roofline.verify_bytes(dense, e_layers, target.bytes_per_expert, args.prompt_len, slot_bytes)
        ms = 1e3 * statistics.median(times)
        out[name] = {"ms": ms, "roofline_ms": 1e3 * b / bw, "ratio": ms / (1e3 * b / bw)}
    return out


def _verifier(name: str) -> Verifier:
    """The verifier ``name``: a registered one, or ``<verifier>_<implementation>`` for a registered verifier whose
    ``Config`` has an ``implementation`` option (e.g. ``hf_grouped_mm``: transformers' grouped_mm experts)."""
    import dataclasses

    from specmoe.registry import verifiers

    if name not in verifiers.names():
        for base in verifiers.names():
            config = getattr(verifiers.get(base), "Config", None)
            if name.startswith(base + "_") and dataclasses.is_dataclass(config) and \
                    any(f.name == "implementation" for f in dataclasses.fields(config)):
                return verifiers.get(base)(implementation=name[len(base) + 1:])
    return verifiers.get(name)()


def _report(r: dict[str, Any], args: argparse.Namespace) -> str:
    c = r["counts"]
    lines = [
        f"target: {args.target or 'demo architecture (random init)'} ({args.dtype})  device {r['device']}  "
        f"threads {r['threads']}  "
        f"clock {r['clock']}  prompt {args.prompt_len}  new tokens {args.new_tokens}  repeats {args.repeats}",
        f"read bandwidth {r['read_gb_s']:.1f} GB/s; drafter {args.drafter}, selector {args.selector}, "
        f"verifier {args.verifier}, gamma {args.budget}: {r['steps']} steps, alpha {r['alpha']:.2f}, E {r['E']:.1f}",
        f"verification reads {r['verify_mb']:.1f} MB -> roofline {r['roofline_verify_ms']:.2f} ms; "
        f"T_verify {r['t_verify_ms']:.2f} ms = {r['verify_over_roofline']:.2f}x roofline   (target <= 3x)",
        f"step reads {r['verify_mb'] + r['drafter_mb'] + r['predictor_mb']:.1f} MB (drafter {r['drafter_mb']:.1f}, "
        f"predictor {r['predictor_mb']:.1f}) -> roofline {r['roofline_step_ms']:.2f} ms; step {r['t_total_ms']:.2f} "
        f"ms = {r['step_over_roofline']:.2f}x   (target <= 4x)",
        "step phases: " + ", ".join(f"{k} {100 * r['frac_' + k]:.1f} %" for k in ("draft", "pred", "select", "verify"))
        + f"; overhead (step - draft - pred - verify) {100 * r['frac_overhead']:.1f} %   (target <= 5 %)",
        "aten ops / step: " + ", ".join(f"{k} {v:.0f}" for k, v in c["ops"].items())
        + f"  (total {sum(c['ops'].values()):.0f})",
        "host syncs / step: " + ", ".join(f"{k} {v:.1f}" for k, v in c["syncs"].items())
        + f"  (total {sum(c['syncs'].values()):.1f}; " + ", ".join(f"{k} {v:.1f}" for k, v in c["sync_kinds"].items())
        + ")",
        f"ar {r['ar_tok_s']:.1f} tok/s vs model.generate {r['hf_generate_tok_s']:.1f} tok/s: "
        f"{r['ar_vs_generate']:.3f}x   (target >= 1.0)",
        "KV pruning (non-prefix path): " + ", ".join(f"context {k}: {v:.0f} us" for k, v in r["prune_us"].items()),
    ]
    ver = ", ".join(f"{k} {v['ms']:.2f} ms ({v['ratio']:.2f}x)" if "ms" in v else f"{k}: {v['error']}"
                    for k, v in r["verifiers"].items())
    lines.append(f"verification pass by experts implementation ({args.budget} tokens, {args.prompt_len} cached): "
                 + ver)
    b = r["breakdown"]
    lines.append(f"verification pass, cold caches ({args.verifier}): {b['total_ms']:.2f} ms = experts "
                 f"{b['experts_ms']:.2f} ms ({b['experts_mb']:.1f} MB, {b['experts_gb_s']:.1f} GB/s) + linear layers "
                 f"{b['linear_ms']:.2f} ms ({b['linear_mb']:.1f} MB, {b['linear_gb_s']:.1f} GB/s) + attention "
                 f"{b['attention_ms']:.2f} ms (KV {b['kv_mb']:.1f} MB) + routers {b['router_ms']:.2f} ms + the rest "
                 f"(norms, rotary, masks, module calls) {b['other_ms']:.2f} ms")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    return run_on_target(args, "engine", measure, _report)
