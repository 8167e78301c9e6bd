# SPDX-License-Identifier: Apache-2.0
"""Plain autoregressive decoding with the model's own KV cache and masks: the reference for correctness
(speculative output must equal it at T = 0) and for speed (speedup is relative to it)."""

from __future__ import annotations

import time
from typing import Sequence

import torch

from specmoe.decoding.engine import _sync, experts_per_layer, first_token
from specmoe.decoding.records import Generation, StepRecord
from specmoe.decoding.stopping import StopRule
from specmoe.interfaces.target import Target

__all__ = ["ar_generate"]


@torch.no_grad()
def ar_generate(target: Target, prompts: Sequence[Sequence[int]], *, temperature: float, stop: StopRule,
                seed: int = 0, capture_routing: bool = True) -> Generation:
    """Generate one token per target pass; rows of a batch are left-padded as ``generate`` does."""
    dev = target.device
    bsz = len(prompts)
    gen = torch.Generator(device=dev).manual_seed(seed)
    m = max(len(p) for p in prompts)
    ids = torch.zeros(bsz, m, dtype=torch.long)
    mask = torch.zeros(bsz, m, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, m - len(p):] = torch.tensor(list(p))
        mask[b, m - len(p):] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    cache = target.new_standard_cache()
    _sync(dev)
    t_start = time.perf_counter()
    out = target.forward_standard(ids, mask, positions, cache)
    outputs: list[list[int]] = [[] for _ in range(bsz)]
    active = [True] * bsz
    nxt = []
    for b in range(bsz):
        tok = first_token(out.logits[b, -1], temperature, gen)
        nxt.append(tok)
        if stop.extend(outputs[b], [tok]):
            active[b] = False
    _sync(dev)
    prefill = time.perf_counter() - t_start
    pos = positions[:, -1]
    records: list[StepRecord] = []
    while any(active):
        t0 = time.perf_counter()
        pos = pos + 1
        step_ids = torch.tensor(nxt, dtype=torch.long, device=dev)[:, None]
        mask = torch.cat([mask, torch.ones(bsz, 1, dtype=mask.dtype, device=dev)], dim=1)
        out = target.forward_standard(step_ids, mask, pos[:, None], cache, capture_routing=capture_routing)
        _sync(dev)
        t1 = time.perf_counter()
        act = torch.tensor(active, device=dev)
        e_layers = experts_per_layer(out.routing, act[:, None], target.num_experts) if capture_routing else []
        e_pass = experts_per_layer(out.routing, torch.ones_like(act[:, None]), target.num_experts) \
            if capture_routing else None
        accepted = []
        for b in range(bsz):
            if not active[b]:
                continue
            tok = first_token(out.logits[b, -1], temperature, gen)
            nxt[b] = tok
            before = len(outputs[b])
            if stop.extend(outputs[b], [tok]):
                active[b] = False
            accepted.append(len(outputs[b]) - before)
        _sync(dev)
        t2 = time.perf_counter()
        records.append(StepRecord(accepted=accepted, verified=[1] * len(accepted), experts_per_layer=e_layers,
                                  t_verify=t1 - t0, t_total=t2 - t0, pass_experts_per_layer=e_pass))
    return Generation(tokens=outputs, steps=records, wall_time=time.perf_counter() - t_start,
                      prefill_time=prefill)
