# SPDX-License-Identifier: Apache-2.0
"""Memory rooflines of decoding steps: the bytes a pass must read, the device's read bandwidth, and the cost of
pruning a KV cache.

Bytes a verification pass of ``T`` tokens must read (weights in their loaded dtype):

* the target's dense weights: every parameter except the routed experts and the input-embedding table (of
  which only the ``T`` looked-up rows are read);
* the routed experts the pass touches: ``sum over MoE layers of |union| x bytes_per_expert``;
* the KV cache it attends over: ``slots x sum over attention layers of (key + value bytes per slot)``.

A drafter's or predictor's own reads per step are its parameters (input-embedding tables excluded) times the
forward passes it runs per step, plus its KV cache per pass. Roofline time = bytes / measured read bandwidth.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Callable, Iterable

import torch

if TYPE_CHECKING:
    from specmoe.interfaces.kv import KVState
    from specmoe.interfaces.target import Target

__all__ = ["read_bandwidth", "module_bytes", "target_dense_bytes", "kv_bytes_per_slot", "verify_bytes",
           "prune_cost"]


def read_bandwidth(device: torch.device, clock: Callable[[], float] = time.perf_counter, mib: int = 512,
                   repeats: int = 7) -> float:
    """Bytes/s of a read-only reduction over ``mib`` MiB (median of ``repeats``; far larger than any cache). On a
    GPU the reduction is 4 GiB (past its L2) timed with CUDA events: ``clock`` (possibly a CPU-time clock) is the
    host's."""
    cuda = device.type == "cuda"
    buf = torch.ones((4096 if cuda else mib) * (1 << 20) // 4, dtype=torch.float32, device=device)
    buf.sum()
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            buf.sum()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = clock()
            buf.sum()
            times.append(clock() - t0)
    return buf.numel() * 4 / statistics.median(times)


def module_bytes(modules: Iterable[torch.nn.Module]) -> int:
    """Bytes of the parameters and buffers of ``modules`` (each counted once), embedding tables excluded."""
    seen: set[int] = set()
    skip: set[int] = set()
    total = 0
    for mod in modules:
        for sub in mod.modules():
            if isinstance(sub, torch.nn.Embedding):
                skip.update(id(p) for p in sub.parameters())
        for t in list(mod.parameters()) + list(mod.buffers()):
            if id(t) in seen or id(t) in skip or not t.is_floating_point():
                continue
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def target_dense_bytes(target: Target) -> int:
    """The target's parameters read by every pass: all but the routed experts and the input embedding."""
    expert_ids = {id(p) for m in target.experts_modules() for p in m.parameters()}
    embed = target.parts().embed_tokens
    skip = expert_ids | {id(p) for p in embed.parameters()}
    seen: set[int] = set()
    total = 0
    for p in target.parts().lm_head.parameters():
        seen.add(id(p))
        total += p.numel() * p.element_size()
    for mod in (target.parts().final_norm, *target.routers(), *target.router_inputs_norms()):
        for p in mod.parameters():
            if id(p) not in seen and id(p) not in skip:
                seen.add(id(p))
                total += p.numel() * p.element_size()
    model = getattr(target, "model", None)
    if model is not None:  # everything else in the decoder (attention, norms, shared experts, dense MLPs)
        for p in model.parameters():
            if id(p) not in seen and id(p) not in skip:
                seen.add(id(p))
                total += p.numel() * p.element_size()
    return total


def kv_bytes_per_slot(kv: KVState) -> int:
    """Bytes one cached slot (one row) occupies over every attention layer of a KV state (keys + values)."""
    total = 0
    for layer in kv.cache.layers:
        if getattr(layer, "keys", None) is None:
            continue
        k, v = layer.keys, layer.values
        total += (k.shape[1] * k.shape[3] * k.element_size()) + (v.shape[1] * v.shape[3] * v.element_size())
    return total


def verify_bytes(dense: int, experts_per_layer: list[int], bytes_per_expert: int, kv_slots: int,
                 kv_slot_bytes: int, rows: int = 1) -> int:
    """Bytes a verification pass must read (see the module docstring)."""
    return dense + sum(experts_per_layer) * bytes_per_expert + rows * kv_slots * kv_slot_bytes


def prune_cost(target: Target, context: int, *, rows: int = 1, nodes: int = 6, keep: list[int] | None = None,
               repeats: int = 30, clock: Callable[[], float] = time.perf_counter, seed: int = 0) -> float:
    """Median seconds of :meth:`KVState.keep_last` after a ``nodes``-token tree pass over ``context`` cached
    tokens, keeping a path that is not a prefix of the verified order (``keep``, default ``[0, 2, 3]``): the
    slots that move are the kept ones of the last pass, whatever ``context`` is."""
    from specmoe.interfaces.tree import DraftTree

    dev = target.device
    keep = keep or [0, 2, 3]
    gen = torch.Generator().manual_seed(seed)
    kv = target.new_kv(rows, context + nodes)
    ids = torch.randint(0, target.vocab_size, (rows, context), generator=gen).to(dev)
    target.forward(ids, kv, torch.arange(context, device=dev).expand(rows, context))
    parents = [-1, 0, 0, 2] + [3] * (nodes - 4)
    tree = DraftTree.from_lists(list(range(1, nodes + 1)), parents[:nodes], device=dev)
    tokens = tree.tokens.expand(rows, nodes)
    anc = tree.ancestors().expand(rows, nodes, nodes)
    times = []
    for _ in range(repeats):
        target.forward(tokens, kv, context + tree.depth.expand(rows, nodes), anc,
                       torch.ones(rows, nodes, dtype=torch.bool, device=dev))
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = clock()
        kv.keep_last(nodes, [keep] * rows)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(clock() - t0)
        kv.drop_last(len(keep))
    return statistics.median(times)
