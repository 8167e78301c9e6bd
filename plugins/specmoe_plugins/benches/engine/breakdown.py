# SPDX-License-Identifier: Apache-2.0
"""Where a verification pass spends its time: the experts implementation, the linear layers, attention, the
routers, and the rest (the model library's per-layer code: norms, rotary embeddings, residuals, module calls).

Module hooks time each part (CUDA events on a GPU, read after the passes; the host clock elsewhere), and each
part's bytes give its achieved bandwidth: the routed experts the pass touched, the linear layers' weights, the
KV cache. Between passes the caches are flushed (on a CPU by writing a buffer larger than the last-level
cache), as in a decoding step where the drafter runs between two verifications.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Callable

import torch

if TYPE_CHECKING:
    from specmoe.interfaces.target import Target

__all__ = ["verify_breakdown"]


class _Timer:
    def __init__(self, device: torch.device, clock: Callable[[], float]) -> None:
        self.cuda = device.type == "cuda"
        self.clock = clock
        self.open: dict[int, Any] = {}
        self.spans: dict[str, list] = defaultdict(list)

    def start(self, key: int) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.open[key] = ev
        else:
            self.open[key] = self.clock()

    def stop(self, key: int, part: str) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.spans[part].append((self.open.pop(key), ev))
        else:
            self.spans[part].append(self.clock() - self.open.pop(key))

    def seconds(self, part: str) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return sum(a.elapsed_time(b) for a, b in self.spans[part]) / 1e3
        return sum(self.spans[part])


def _hook(modules: list[torch.nn.Module], timer: _Timer, part: str) -> list:
    handles = []
    for m in modules:
        handles.append(m.register_forward_pre_hook(lambda mod, args: timer.start(id(mod))))
        handles.append(m.register_forward_hook(lambda mod, args, out, part=part: timer.stop(id(mod), part)))
    return handles


def verify_breakdown(target: Target, *, context: int, tokens: int, repeats: int = 10,
                     clock: Callable[[], float] = time.perf_counter, seed: int = 2) -> dict[str, Any]:
    """Mean milliseconds per verification pass (``tokens`` new tokens in a chain over ``context`` cached ones)
    of every part, with the bytes each part read and its bandwidth."""
    from specmoe.decoding.analysis import experts_per_layer
    from specmoe.interfaces.tree import DraftTree
    from specmoe_plugins.benches.engine.roofline import kv_bytes_per_slot

    dev = target.device
    gen = torch.Generator().manual_seed(seed)
    kv = target.new_kv(1, context + tokens)
    target.forward(torch.randint(0, target.vocab_size, (1, context), generator=gen).to(dev), kv,
                   torch.arange(context, device=dev)[None])
    tree = DraftTree.from_lists(list(range(1, tokens + 1)), list(range(-1, tokens - 1)), device=dev)
    model = getattr(target, "model", None)
    experts = target.experts_modules()
    expert_ids = {id(m) for m in experts}
    linears = [m for m in (model.modules() if model is not None else []) if isinstance(m, torch.nn.Linear)]
    attn = [m for m in (model.modules() if model is not None else [])
            if type(m).__name__.endswith("Attention") and id(m) not in expert_ids]
    flush = torch.ones(64 << 20, device=dev) if dev.type == "cpu" else None
    timer = _Timer(dev, clock)
    totals, e_bytes = [], []
    in_attn = {id(m) for a in attn for m in a.modules()}
    handles = _hook(experts, timer, "experts") + _hook(attn, timer, "attention") \
        + _hook([m for m in linears if id(m) in in_attn], timer, "linear_attn") \
        + _hook([m for m in linears if id(m) not in in_attn], timer, "linear_other") \
        + _hook(target.routers(), timer, "router")
    try:
        for i in range(repeats + 2):
            toks = torch.randint(0, target.vocab_size, (1, tokens), generator=gen).to(dev)
            if flush is not None:
                flush.add_(1.0)
            if i == 2:
                for part in list(timer.spans):
                    timer.spans[part].clear()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = clock()
            out = target.forward(toks, kv, context + tree.depth, tree.ancestors(), tree.valid, capture_routing=True)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            if i >= 2:
                totals.append(clock() - t0)
                e_bytes.append(sum(experts_per_layer(out.routing, tree.valid, target.num_experts))
                               * target.bytes_per_expert)
            kv.drop_last(tokens)
    finally:
        for h in handles:
            h.remove()
    n = len(totals)
    ms = {part: 1e3 * timer.seconds(part) / n
          for part in ("experts", "attention", "linear_attn", "linear_other", "router")}
    lin_bytes = sum(m.weight.numel() * m.weight.element_size() for m in linears)
    out: dict[str, Any] = {"total_ms": 1e3 * statistics.mean(totals), "experts_mb": statistics.mean(e_bytes) / 1e6,
                           "linear_mb": lin_bytes / 1e6, "kv_mb": context * kv_bytes_per_slot(kv) / 1e6}
    out["experts_ms"], out["router_ms"] = ms["experts"], ms["router"]
    out["linear_ms"] = ms["linear_attn"] + ms["linear_other"]
    out["attention_ms"] = ms["attention"] - ms["linear_attn"]  # attention modules contain their projections
    out["other_ms"] = out["total_ms"] - ms["experts"] - out["linear_ms"] - out["attention_ms"] - ms["router"]
    out["experts_gb_s"] = out["experts_mb"] / max(ms["experts"], 1e-9)
    out["linear_gb_s"] = out["linear_mb"] / max(out["linear_ms"], 1e-9)
    return out
