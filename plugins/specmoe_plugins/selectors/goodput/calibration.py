# SPDX-License-Identifier: Apache-2.0
"""Offline calibration of goodput's step cost model (``platform bench goodput_cost``, the ``calibrate_cost`` stage).

Times the target's verification call (``Target.forward``: 4D mask over a KV-cache prefix, routing captured, as
the engine calls it) with the routing forced (router forward hooks) so that every MoE layer touches exactly
``u`` experts, over a grid of batch rows x cached context x tokens per row x union sizes (``u`` from top_k to
``min(E, T * top_k)``, evenly spaced). Every configuration is timed once per round, rounds in a new random
order. A random part of the calls is held out; the :class:`~.cost_model.CostModel` is fitted
on the rest (relative Huber) and its median absolute relative error is reported on both, then saved as JSON.

``--check-steps N`` also runs N generations of the speculative engine (self-drafting, confidence selection,
random prompts, mixed gamma and batch) and reports the error on its real steps (the engine's measured
``t_verify`` with the router's real unions): of the offline model, and of a copy refitted online from the
steps before each one (what a selector fed by the engine would predict).
"""

from __future__ import annotations

import random
import time
from typing import Any

__all__ = ["grid", "calibrate", "shape_of", "fit_split", "engine_check"]


def grid(top_k: int, num_experts: int, gammas: list[int], batches: list[int], contexts: list[int],
         unions_per_t: int) -> list[tuple[int, int, int, int]]:
    """``(batch, context, gamma, union)`` configurations; unions evenly spaced in ``[k, min(E, T k)]``."""
    out = []
    for b in batches:
        for c in contexts:
            for g in gammas:
                top = min(num_experts, b * g * top_k)
                steps = max(unions_per_t, 1)
                us = sorted({round(top_k + (top - top_k) * i / max(steps - 1, 1)) for i in range(steps)})
                out += [(b, c, g, u) for u in us]
    return out


def _clock(name: str, device: Any):
    if name == "thread":
        if device.type != "cpu":
            from specmoe.errors import UserError

            raise UserError("--clock thread measures CPU time of this thread: use it on CPU only")
        return time.thread_time
    return time.perf_counter


def calibrate(target: Any, configs: list[tuple[int, int, int, int]], *, iters: int, warmup: int, seed: int,
              clock: str = "wall") -> list[dict[str, Any]]:
    """One record ``{batch, context, gamma, union, seconds}`` per timed call."""
    import torch

    from specmoe.decoding.clock import device_sync
    from specmoe.interfaces.kv import KVState
    from specmoe_plugins.selectors.goodput.expert_latency import forced_routing, override_routers

    dev, k, n_exp = target.device, target.top_k, target.num_experts
    routers = target.routers()
    now = _clock(clock, dev)
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    forced: list[tuple[Any, Any]] = []
    hooks = override_routers(routers, forced)
    records: list[dict[str, Any]] = []
    try:
        caches = {}
        for b, c in sorted({(b, c) for b, c, _, _ in configs}):
            kv = KVState(b, dev)
            forced[:] = [forced_routing(b * c, k, k, n_exp, gen) for _ in routers]
            ids = torch.randint(0, target.vocab_size, (b, c), generator=gen).to(dev)
            target.forward(ids, kv, torch.arange(c, device=dev).expand(b, c))
            caches[(b, c)] = kv
        for rnd in range(warmup + iters):
            order = list(configs)
            rng.shuffle(order)
            for b, c, g, u in order:
                kv = caches[(b, c)]
                forced[:] = [forced_routing(b * g, k, u, n_exp, gen) for _ in routers]
                ids = torch.randint(0, target.vocab_size, (b, g), generator=gen).to(dev)
                pos = (c + torch.arange(g, device=dev)).expand(b, g)
                device_sync(dev)
                t0 = now()
                target.forward(ids, kv, pos, capture_routing=True)
                device_sync(dev)
                dt = now() - t0
                kv.drop_last(g)
                if rnd >= warmup:
                    records.append({"batch": b, "context": c, "gamma": g, "union": u, "seconds": dt})
    finally:
        for h in hooks:
            h.remove()
    return records


def shape_of(rec: dict[str, Any], layers: int):
    """The :class:`VerifyShape` of a calibration record (every MoE layer touched ``union`` experts)."""
    from specmoe_plugins.selectors.goodput.cost_model import VerifyShape

    return VerifyShape(tokens=rec["batch"] * rec["gamma"], expert_layers=float(layers * rec["union"]),
                       rows=rec["batch"], width=rec["gamma"], kv_slots=rec["context"])


def fit_split(records: list[dict[str, Any]], layers: int, features: list[str], holdout: float, seed: int):
    """Fit on a random ``1 - holdout`` of the calls; returns ``(model, train errors, held-out errors)``."""
    from specmoe_plugins.selectors.goodput.cost_model import CostModel, relative_errors

    idx = list(range(len(records)))
    random.Random(seed).shuffle(idx)
    n_held = int(round(holdout * len(idx)))
    held, train = [records[i] for i in idx[:n_held]], [records[i] for i in idx[n_held:]]
    model = CostModel(features=features)
    train_err = model.fit([shape_of(r, layers) for r in train], [r["seconds"] for r in train])
    held_err = relative_errors([model.predict_verify(shape_of(r, layers)) for r in held],
                               [r["seconds"] for r in held])
    return model, train_err, held_err


def engine_check(target: Any, model: Any, *, generations: int, seed: int,
                 max_new: int = 24) -> dict[str, dict[str, Any]]:
    """Errors on the verification passes of real engine steps (see the module docstring).

    Returns ``{"offline": errors of model, "online": errors of a copy refitted online}``; the online copy
    starts from ``model`` as its prior and predicts every step before it observes it (prequential), as a
    selector fed by the engine would.
    """
    import torch

    from specmoe.decoding.engine import SpeculativeEngine
    from specmoe.decoding.stopping import StopRule
    from specmoe.registry import drafters, selectors
    from specmoe_plugins.selectors.goodput.cost_model import CostModel, VerifyShape, relative_errors

    drafter = drafters.get("draft_model")(share_target=True)
    drafter.setup(target)
    engine = SpeculativeEngine(target, drafter, selectors.get("confidence")())
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    online = CostModel.from_dict(model.to_dict())
    pred, pred_online, meas = [], [], []
    for _ in range(generations):
        bsz, gamma, plen = rng.choice([1, 1, 2, 4]), rng.choice([1, 2, 4, 6, 8]), rng.choice([32, 128, 256, 512])
        prompts = [torch.randint(0, target.vocab_size, (plen,), generator=gen).tolist() for _ in range(bsz)]
        out = engine.generate(prompts, budget=gamma, steps=3, top_k=2, temperature=0, stop=StopRule(max_new))
        slots = plen
        for s in out.steps:
            shape = VerifyShape(tokens=sum(s.verified), expert_layers=float(sum(s.experts_per_layer)), rows=bsz,
                                width=max(s.verified), kv_slots=slots)
            pred.append(model.predict_verify(shape))
            pred_online.append(online.predict_verify(shape))
            online.observe_verify(shape, s.t_verify)
            meas.append(s.t_verify)
            slots += max(s.accepted)
    return {"offline": relative_errors(pred, meas), "online": relative_errors(pred_online, meas)}
