# SPDX-License-Identifier: Apache-2.0
"""Plain autoregressive decoding: the reference for correctness (speculative output must equal it at T = 0)
and for speed (speedup is relative to it).

Uses the same :meth:`Target.forward` as the engine's verification (no slower reference); one host read per step
at T = 0; the analysis runs after the timed region.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from specmoe.decoding.analysis import experts_per_layer
from specmoe.decoding.clock import PhaseClock, device_sync
from specmoe.decoding.engine import next_tokens, pad_rows
from specmoe.decoding.inputs import check_ar
from specmoe.decoding.records import Generation, StepRecord
from specmoe.decoding.stopping import StopRule
from specmoe.interfaces.target import Target

__all__ = ["ar_generate"]


@torch.no_grad()
def ar_generate(target: Target, prompts: Sequence[Sequence[int]], *, temperature: float, stop: StopRule,
                seed: int = 0, capture_routing: bool = True,
                clock: Callable[[], float] | None = None) -> Generation:
    """Generate one token per target pass. ``clock``: host clock of the step timings on non-CUDA devices."""
    check_ar(target, prompts, temperature=temperature, stop=stop, seed=seed)
    dev = target.device
    bsz = len(prompts)
    gen = torch.Generator(device=dev).manual_seed(seed)
    lens = [len(p) for p in prompts]
    ids, valid = pad_rows(prompts, dev)
    m = ids.shape[1]
    positions = torch.arange(m, device=dev).expand(bsz, m)
    last = torch.tensor(lens, device=dev)[:, None] - 1
    timer = PhaseClock(dev, clock)
    device_sync(dev)
    start = timer.mark()
    kv = target.new_kv(bsz, capacity=m + stop.max_new_tokens + 1)
    out = target.forward(ids, kv, positions, None, valid, logits_at=last)
    outputs: list[list[int]] = [[] for _ in range(bsz)]
    active = [True] * bsz
    nxt = next_tokens(out.logits[:, 0], temperature, gen, range(bsz))
    for b in range(bsz):
        if stop.extend(outputs[b], [nxt[b]]):
            active[b] = False
    prefill_end = timer.mark()
    pos = last
    attend = torch.ones(bsz, 1, 1, dtype=torch.bool, device=dev)
    records: list[StepRecord] = []
    routings: list[tuple[torch.Tensor, list[bool]]] = []
    marks: list[tuple[int, int, int]] = []
    while any(active):
        t0 = timer.mark()
        pos = pos + 1
        step_ids = torch.tensor(nxt, dtype=torch.long).to(dev, non_blocking=True)[:, None]
        out = target.forward(step_ids, kv, pos, attend, capture_routing=capture_routing)
        t1 = timer.mark()
        rows = [b for b in range(bsz) if active[b]]
        routings.append((out.routing, list(active)))
        accepted = []
        for b, tok in zip(rows, next_tokens(out.logits[:, -1], temperature, gen, rows)):
            nxt[b] = tok
            before = len(outputs[b])
            if stop.extend(outputs[b], [tok]):
                active[b] = False
            accepted.append(len(outputs[b]) - before)
        t2 = timer.mark()
        records.append(StepRecord(accepted=accepted, verified=[1] * len(accepted), experts_per_layer=[]))
        marks.append((t0, t1, t2))
    timer.sync()
    end = timer.mark()
    wall = timer.seconds(start, end)
    for rec, (routing, act), (t0, t1, t2) in zip(records, routings, marks):  # after the timed region
        rec.t_verify, rec.t_total = timer.seconds(t0, t1), timer.seconds(t0, t2)
        if capture_routing:
            act_t = torch.tensor(act, device=dev)[:, None]
            rec.experts_per_layer = experts_per_layer(routing, act_t, target.num_experts)
            rec.pass_experts_per_layer = experts_per_layer(routing, torch.ones_like(act_t), target.num_experts)
    return Generation(tokens=outputs, steps=records, wall_time=wall, prefill_time=timer.seconds(start, prefill_end))
