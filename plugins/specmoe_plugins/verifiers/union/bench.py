# SPDX-License-Identifier: Apache-2.0
"""Verifier experts kernels on one MoE layer: time per call and achieved bandwidth vs the device's.

GPU: synthetic bf16 weights with GPT-OSS-120B (H 2880, I 2880, E 128, top-4) and Qwen3-235B (H 4096, I 1536,
E 128, top-8) expert shapes; ``T = gamma * batch`` tokens routed onto a controlled union of ``|U|`` experts
(``min`` = one expert set, ``max`` = all distinct, ``mid`` between); times ``hf_grouped_mm``, ``hf_eager``,
``torch_union``, ``triton_union`` (and ``triton_union`` replayed from a CUDA graph) with CUDA events after a
warm-up, L2 flushed before every call, median. Bytes per call = ``|U| * bytes_per_expert``; the device's
read bandwidth (a reduction over 4 GiB) and copy bandwidth (read + write) are measured in the same run.

CPU (no CUDA, or ``--cpu``): the same sweep at tiny sizes for the PyTorch implementations (a code-path check;
its timings mean little).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["add_arguments", "run", "LayerSpec", "MODELS", "TINY_MODELS", "build_experts", "union_routing",
           "sweep"]


@dataclass(frozen=True)
class LayerSpec:
    """Expert shapes of one MoE layer."""

    arch: str
    hidden: int
    inter: int
    experts: int
    top_k: int


MODELS: dict[str, LayerSpec] = {
    "gpt_oss_120b": LayerSpec("gpt_oss", 2880, 2880, 128, 4),
    "qwen3_235b": LayerSpec("qwen3_moe", 4096, 1536, 128, 8),
    "deepseek_v3": LayerSpec("deepseek_v3", 7168, 2048, 256, 8),
}
TINY_MODELS: dict[str, LayerSpec] = {
    "gpt_oss_120b": LayerSpec("gpt_oss", 64, 64, 16, 4),
    "qwen3_235b": LayerSpec("qwen3_moe", 64, 32, 16, 8),
    "deepseek_v3": LayerSpec("deepseek_v3", 64, 32, 16, 8),
}

#: arch -> (experts class, config keys for hidden / intermediate / experts)
_EXPERTS = {
    "gpt_oss": ("transformers.models.gpt_oss.modeling_gpt_oss:GptOssExperts",
                ("hidden_size", "intermediate_size", "num_local_experts")),
    "qwen3_moe": ("transformers.models.qwen3_moe.modeling_qwen3_moe:Qwen3MoeExperts",
                  ("hidden_size", "moe_intermediate_size", "num_experts")),
    "deepseek_v3": ("transformers.models.deepseek_v3.modeling_deepseek_v3:DeepseekV3Experts",
                    ("hidden_size", "moe_intermediate_size", "n_routed_experts")),
}
_UNIONS = ("min", "mid", "max")
_HF_IMPLS = ("hf_grouped_mm", "hf_eager")  # transformers' own experts code (no plugin)
_GRAPH = "_graph"  # suffix: a compiled verifier replayed from a CUDA graph


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpu", action="store_true",
                        help="run the tiny CPU sweep even when CUDA is available")
    parser.add_argument("--models", default="gpt_oss_120b,qwen3_235b", help=f"of {', '.join(MODELS)}")
    parser.add_argument("--gammas", default="1,2,4,6,8", help="verified tokens per sequence")
    parser.add_argument("--batch", type=int, default=1, help="sequences per step (T = gamma * batch)")
    parser.add_argument("--unions", default="min,mid,max",
                        help="union sizes: min (= k), mid, max (all distinct)")
    parser.add_argument("--impls", default=None,
                        help="implementations to time (default: hf_grouped_mm, hf_eager and every registered "
                             "verifier with its own experts forward; <verifier>_graph: replayed from a CUDA graph)")
    parser.add_argument("--iters", type=int, default=None,
                        help="timed calls per cell (default 20 GPU, 3 CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 3 GPU, 1 CPU)")
    parser.add_argument("--seed", type=int, default=0)


def build_experts(spec: LayerSpec, dtype: Any, device: Any, seed: int = 0) -> Any:
    """A ``transformers`` experts module with ``spec``'s shapes and random weights (``1/sqrt(fan_in)``)."""
    import torch

    from specmoe.models.tiny import tiny_config

    target, keys = _EXPERTS[spec.arch]
    mod, cls_name = target.split(":")
    cfg = tiny_config(spec.arch, **dict(zip(keys, (spec.hidden, spec.inter, spec.experts))),
                      num_experts_per_tok=spec.top_k)
    cfg._experts_implementation_internal = "grouped_mm"
    with torch.device("meta"):
        module = getattr(importlib.import_module(mod), cls_name)(cfg)
    module = module.to(dtype).to_empty(device=device).eval().requires_grad_(False)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in module.named_parameters():
        fan_in = spec.hidden if name.startswith("gate_up") else spec.inter
        std = 0.1 if name.endswith("bias") else fan_in ** -0.5
        p.normal_(0.0, std, generator=gen)
    return module


def union_routing(tokens: int, k: int, experts: int, union: int, gen: Any) -> Any:
    """``[T, k]`` int64 expert ids, distinct per row, covering exactly ``min(union, T*k)`` experts."""
    import torch

    union = max(k, min(union, experts))
    pool = torch.randperm(experts, generator=gen)[:union]
    slots = torch.arange(tokens * k).view(tokens, k) % union  # consecutive slots cycle through the pool
    rows = pool[slots]
    order = torch.argsort(torch.rand(tokens, k, generator=gen), dim=1)
    return rows.gather(1, order)


def _union_sizes(t: int, k: int, e: int, which: list[str]) -> list[tuple[str, int]]:
    hi = min(e, t * k)
    sizes = {"min": k, "mid": (k + hi) // 2, "max": hi}
    out: list[tuple[str, int]] = []
    for name in which:
        if all(s != sizes[name] for _, s in out):
            out.append((name, sizes[name]))
    return out


def _verifier_classes() -> dict[str, type]:
    """Registered verifiers that compute the experts themselves (they override ``experts_forward``; the others
    select one of ``transformers``' own implementations), in registry order."""
    from specmoe.interfaces.verifier import Verifier
    from specmoe.registry import verifiers

    return {n: cls for n in verifiers.names()
            if getattr(cls := verifiers.get(n), "experts_forward", None) is not Verifier.experts_forward}


def _compiled(cls: type) -> bool:
    """A verifier with compiled kernels (a ``kernels()`` module): GPU only, also timed replayed from a CUDA graph."""
    return callable(getattr(cls, "kernels", None))


def implementation_names() -> list[str]:
    """``transformers``' own experts code, every registered verifier with its own experts forward and, for those
    with compiled kernels, their CUDA-graph replay (``<name>_graph``)."""
    names = list(_HF_IMPLS)
    for name, cls in _verifier_classes().items():
        names += [name, name + _GRAPH] if _compiled(cls) else [name]
    return names


def _build_verifier(cls: type) -> Any:
    """A verifier with its token cap (``max_tokens``, where its ``Config`` has one) lifted: the bench times the
    kernels at every T, never the fallback above the cap."""
    config = getattr(cls, "Config", None)
    fields = {f.name for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else set()
    return cls(max_tokens=1 << 30) if "max_tokens" in fields else cls()


def _impls(names: list[str], on_gpu: bool) -> tuple[dict[str, Callable], list[str]]:
    """The runnable implementations and messages about those skipped."""
    from transformers.integrations.moe import grouped_mm_experts_forward

    fns: dict[str, Callable] = {
        "hf_grouped_mm": grouped_mm_experts_forward,
        "hf_eager": lambda m, *a: type(m).forward.__wrapped__(m, *a),
    }
    notes: list[str] = []
    for name, cls in _verifier_classes().items():
        if name not in names and name + _GRAPH not in names:
            continue
        if _compiled(cls) and not on_gpu:
            notes.append(f"{name}: skipped on CPU (the interpreter is not a benchmark)")
            continue
        try:
            verifier = _build_verifier(cls)
            if _compiled(cls) and verifier.kernels().is_interpreted():
                raise RuntimeError("TRITON_INTERPRET is set")
        except Exception as exc:  # noqa: BLE001 - report and go on with the other implementations
            notes.append(f"{name}: skipped ({exc})")
            continue
        fns[name] = verifier.experts_forward
        if _compiled(cls):
            fns[name + _GRAPH] = verifier.experts_forward  # replayed from a CUDA graph by the timer
    known = implementation_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        notes.append(f"unknown implementations ignored: {', '.join(unknown)} "
                     f"(choose from {', '.join(known)})")
    return {n: fns[n] for n in names if n in fns}, notes


def _time(call: Callable[[], Any], on_gpu: bool, warmup: int, iters: int, flush: Any, graph: bool) -> float:
    """Median microseconds of ``call``."""
    import torch

    for _ in range(warmup):
        call()
    if not on_gpu:
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    if graph:
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            call()
        call = g.replay
        call()
    times = []
    for _ in range(iters):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def device_bandwidth(device: Any, gib: float = 4.0) -> tuple[float, float]:
    """``(read, copy)`` bytes/s: a reduction over ``gib`` GiB, and ``copy_`` of half of it (read + write)."""
    import torch

    n = int(gib * (1 << 30)) // 2
    buf = torch.ones(n, dtype=torch.bfloat16, device=device)
    no_flush = torch.empty(1, device=device)
    read = _time(lambda: torch.sum(buf, dtype=torch.float32), True, 2, 10, no_flush, False)
    half = n // 2
    src, dst = buf[:half], buf[half:2 * half]
    copy = _time(lambda: dst.copy_(src), True, 2, 10, no_flush, False)
    return 2 * n / (read * 1e-6), 2 * 2 * half / (copy * 1e-6)


def sweep(models: list[str], gammas: list[int], batch: int, unions: list[str], impl_names: list[str], *,
          on_gpu: bool, iters: int, warmup: int, seed: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Time every implementation on every (model, T, union) row; returns ``(rows, notes)``."""
    import torch

    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = torch.bfloat16 if on_gpu else torch.float32
    specs = MODELS if on_gpu else TINY_MODELS
    fns, notes = _impls(impl_names, on_gpu)
    verifier_names = set(_verifier_classes())
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device) if on_gpu else None
    rows: list[dict[str, Any]] = []
    for model_name in models:
        spec = specs[model_name]
        module = build_experts(spec, dtype, device, seed)
        n_params = sum(p.numel() for p in module.parameters())
        per_expert = n_params // spec.experts * module.gate_up_proj.element_size()
        gen = torch.Generator().manual_seed(seed)
        for gamma in gammas:
            t = gamma * batch
            for label, u in _union_sizes(t, spec.top_k, spec.experts, unions):
                idx = union_routing(t, spec.top_k, spec.experts, u, gen).to(device)
                w = torch.softmax(torch.randn(t, spec.top_k, generator=gen), dim=-1).to(device, dtype)
                x = torch.randn(t, spec.hidden, generator=gen).to(device, dtype)
                row: dict[str, Any] = dict(model=model_name, T=t, union=label, U=int(idx.unique().numel()),
                                           bytes=int(idx.unique().numel()) * per_expert)
                ref = fns["hf_grouped_mm"](module, x, idx, w).float() if "hf_grouped_mm" in fns else None
                for name, fn in fns.items():
                    try:
                        call = functools.partial(fn, module, x, idx, w)
                        row[name] = _time(call, on_gpu, warmup, iters, flush, graph=name.endswith(_GRAPH))
                    except Exception as exc:  # noqa: BLE001 - one failing implementation keeps the table
                        row[name] = None
                        notes.append(f"{model_name} T={t} {name}: {type(exc).__name__}: {exc}")
                    if ref is not None and name in verifier_names:
                        diff = (fn(module, x, idx, w).float() - ref).abs().max() / ref.abs().max()
                        row[f"{name}_diff"] = float(diff)
                rows.append(row)
        module = None  # free this layer before building the next one
        if on_gpu:
            torch.cuda.empty_cache()
    return rows, notes


def format_table(rows: list[dict[str, Any]], impls: list[str], read_bw: float | None,
                 copy_bw: float | None) -> str:
    """One fixed-width table: times (µs) per implementation, then the fastest one's bandwidth."""
    head = ["model", "T", "union", "|U|", "MB"] + [f"{n} us" for n in impls] + ["best", "GB/s"]
    if read_bw:
        head += ["%read", "%copy"]
    lines = []
    for r in rows:
        timed = {n: r[n] for n in impls if r.get(n)}
        best = min(timed, key=timed.get) if timed else "-"
        gbs = r["bytes"] / (timed[best] * 1e-6) / 1e9 if timed else 0.0
        cells = [r["model"], str(r["T"]), r["union"], str(r["U"]), f"{r['bytes'] / 1e6:.1f}"]
        cells += [f"{r[n]:.1f}" if r.get(n) else "-" for n in impls] + [best, f"{gbs:.1f}"]
        if read_bw:
            cells += [f"{100 * gbs * 1e9 / read_bw:.0f}", f"{100 * gbs * 1e9 / copy_bw:.0f}"]
        lines.append(cells)
    widths = [max(len(c) for c in col) for col in zip(head, *lines)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*c) for c in lines])


def run(args: argparse.Namespace) -> int:
    import torch

    from specmoe.errors import UserError

    models = [m for m in args.models.split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad:
        raise UserError(f"bench verifier --models: unknown {', '.join(bad)}; choose from {', '.join(MODELS)}")
    gammas = [int(g) for g in args.gammas.split(",") if g]
    unions = [u for u in args.unions.split(",") if u]
    if any(u not in _UNIONS for u in unions) or not gammas or min(gammas) < 1:
        raise UserError(f"bench verifier: --unions takes {', '.join(_UNIONS)}; --gammas positive integers")
    on_gpu = torch.cuda.is_available() and not args.cpu
    if not torch.cuda.is_available():
        print("bench verifier: CUDA is not available: skipping the GPU sweep (real expert shapes, bf16); "
              "running the tiny CPU sweep of the PyTorch implementations instead")
    impls = implementation_names() if args.impls is None else [n for n in args.impls.split(",") if n]
    if not on_gpu:  # compiled verifiers (and their graph replays) time nothing meaningful on a CPU
        compiled = {n for n, cls in _verifier_classes().items() if _compiled(cls)}
        impls = [n for n in impls if n not in compiled and n.removesuffix(_GRAPH) not in compiled]
    torch.manual_seed(args.seed)
    read_bw = copy_bw = None
    if on_gpu:
        read_bw, copy_bw = device_bandwidth(torch.device("cuda"))
        print(f"device {torch.cuda.get_device_name()}: read {read_bw / 1e9:.0f} GB/s, copy (read+write) "
              f"{copy_bw / 1e9:.0f} GB/s")
    iters = args.iters if args.iters is not None else (20 if on_gpu else 3)
    warmup = args.warmup if args.warmup is not None else (3 if on_gpu else 1)
    if iters < 1 or warmup < 0 or args.batch < 1:
        raise UserError("bench verifier: --iters and --batch must be >= 1, --warmup >= 0")
    rows, notes = sweep(models, gammas, args.batch, unions, impls, on_gpu=on_gpu, iters=iters, warmup=warmup,
                        seed=args.seed)
    shown = [n for n in impls if any(n in r for r in rows)]
    print(format_table(rows, shown, read_bw, copy_bw))
    diffs = [(r["model"], r["T"], k, v) for r in rows for k, v in r.items() if k.endswith("_diff")]
    if diffs:
        worst = max(diffs, key=lambda d: d[3])
        print(f"max relative difference vs hf_grouped_mm: {worst[3]:.2e} "
              f"({worst[2][:-5]}, {worst[0]}, T={worst[1]})")
    for note in notes:
        print("note:", note)
    return 0
