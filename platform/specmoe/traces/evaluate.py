# SPDX-License-Identifier: Apache-2.0
"""Held-out top-K routing accuracy of any expert predictor, through its decoding interface.

Each traced sample is replayed the way the engine drives a predictor: the first token is committed
(``observe(first=True)``), then repeatedly a chain-shaped :class:`~specmoe.interfaces.tree.DraftTree` of the
next ``chunk`` tokens (rooted at the last committed token) is scored with ``predict`` and its tokens are
committed with ``observe``. Every token is scored exactly once, with all of its true context, so the number
is the paper's "routing prediction accuracy" (App. B.1) measured on the same code path as decoding.
Command line: ``platform traces evaluate`` (:mod:`specmoe.cli.traces`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from specmoe.traces.format import TraceReader

__all__ = ["chain_tree", "evaluate_predictor", "evaluate_lookup"]


def chain_tree(tokens: torch.Tensor):
    """A one-row :class:`DraftTree` whose nodes form the path ``tokens[0] -> tokens[1] -> ...``."""
    from specmoe.interfaces.tree import DraftTree

    n = tokens.numel()
    dev = tokens.device
    ar = torch.arange(n, device=dev)[None]
    zeros = torch.zeros(1, n, dtype=torch.float32, device=dev)
    return DraftTree(tokens=tokens.long()[None], parents=ar - 1, depth=ar.clone(), logp=zeros,
                     path_logp=zeros.clone(), valid=torch.ones(1, n, dtype=torch.bool, device=dev))


def _committed(tokens: torch.Tensor, start: int, first: bool):
    from specmoe.interfaces.drafter import Committed

    n = tokens.numel()
    pos = torch.arange(start, start + n, device=tokens.device)[None]
    return Committed(tokens.long()[None], torch.ones(1, n, dtype=torch.bool, device=tokens.device), pos, None,
                     first=first)


@torch.no_grad()
def evaluate_predictor(predictor: Any, reader: TraceReader, split: str = "test", *, chunk: int = 32,
                       max_samples: Optional[int] = None,
                       device: torch.device | str = "cpu") -> dict[str, Any]:
    """Top-K overlap accuracy of ``predictor`` (already ``setup``) on ``split`` of the traces.

    Returns:
        ``{"acc": float, "acc_per_layer": [L], "tokens": int, "samples": int}``.
    """
    from specmoe.training.routing_metrics import TopKRoutingAccuracy

    metric = TopKRoutingAccuracy(reader.meta.num_layers, reader.meta.top_k)
    records = reader.samples(split)[:max_samples]
    for rec in records:
        cols = reader.read(rec)
        ids = cols["token_ids"].to(device)
        gt = cols["routing"].to(device)
        state = predictor.begin(1)
        predictor.observe(state, _committed(ids[:1], 0, True))
        s, scored = 0, 0
        while scored < ids.numel():
            e = min(s + chunk, ids.numel())
            sets = predictor.predict(state, chain_tree(ids[s:e]))[0]  # [n, L, E]
            new = slice(scored - s, e - s)
            metric.update(sets[new].cpu(), gt[scored:e].cpu())
            scored = e
            if e < ids.numel():
                predictor.observe(state, _committed(ids[s + 1:e], s + 1, False))
            s = e - 1
    res = metric.compute()
    return {"acc": float(res["acc"]), "acc_per_layer": [float(a) for a in res["acc_per_layer"]],
            "tokens": int(metric.tokens), "samples": len(records)}


def evaluate_lookup(lookup: Any, reader: TraceReader, split: str = "test") -> dict[str, Any]:
    """Accuracy of a context-free predictor ``lookup(ids [T]) -> [T, L, K]`` (e.g. a token table)."""
    from specmoe.decoding.expert_sets import indices_to_sets
    from specmoe.training.routing_metrics import TopKRoutingAccuracy

    m = reader.meta
    metric = TopKRoutingAccuracy(m.num_layers, m.top_k)
    for _, cols in reader.iter_shards(split):
        sets = indices_to_sets(lookup(cols["token_ids"].long()), m.num_experts)
        metric.update(sets, cols["routing"].long())
    res = metric.compute()
    return {"acc": float(res["acc"]), "acc_per_layer": [float(a) for a in res["acc_per_layer"]],
            "tokens": int(metric.tokens)}
