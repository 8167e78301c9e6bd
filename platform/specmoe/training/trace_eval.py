# SPDX-License-Identifier: Apache-2.0
"""Held-out top-K routing accuracy of any expert predictor, through its decoding interface.

Each traced sample is replayed the way the engine drives a predictor: the first token is committed
(``observe(first=True)``), then repeatedly a chain :class:`~specmoe.interfaces.tree.DraftTree` of the next
``chunk`` tokens is scored with ``predict`` and committed with ``observe``. Every token is scored exactly once,
with all of its true context (the paper's "routing prediction accuracy", App. B.1). Predictors that read the
drafter's node features get the teacher-forced ones (``Drafter.teacher_features`` at ``feature_depth``).
Command line: ``platform traces evaluate``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from specmoe.traces.format import TraceReader

if TYPE_CHECKING:
    from specmoe.interfaces.drafter import Drafter
    from specmoe.interfaces.predictor import Predictor
    from specmoe.interfaces.target import Target

__all__ = ["chain_tree", "sample_features", "evaluate_predictor", "evaluate_lookup"]


def chain_tree(tokens: torch.Tensor, features: Optional[torch.Tensor] = None):
    """A one-row :class:`DraftTree` whose nodes form the path ``tokens[0] -> tokens[1] -> ...`` (with node
    ``features [N, F]`` when given)."""
    from specmoe.interfaces.tree import DraftTree

    n = tokens.numel()
    dev = tokens.device
    ar = torch.arange(n, device=dev)[None]
    zeros = torch.zeros(1, n, dtype=torch.float32, device=dev)
    return DraftTree(tokens=tokens.long()[None], parents=ar - 1, depth=ar.clone(), logp=zeros,
                     path_logp=zeros.clone(), valid=torch.ones(1, n, dtype=torch.bool, device=dev),
                     features=None if features is None else features[None])


@torch.no_grad()
def sample_features(drafter: Drafter, target: Target, ids: torch.Tensor, depth: int = 1) -> torch.Tensor:
    """``[T, F]`` teacher-forced node features of one sample's tokens ``ids [T]`` at tree depth ``depth``."""
    from specmoe.training.teacher import teacher_forward

    tokens = ids[None].to(target.device)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    hidden = None
    if drafter.feature_layers:
        hidden, _ = teacher_forward(target, tokens, valid, drafter.feature_layers, target.device, logits=False)
    return drafter.teacher_features(tokens, valid, hidden, depth)[depth - 1][0]


def _committed(tokens: torch.Tensor, start: int, first: bool):
    from specmoe.interfaces.drafter import Committed

    n = tokens.numel()
    pos = torch.arange(start, start + n, device=tokens.device)[None]
    return Committed(tokens.long()[None], torch.ones(1, n, dtype=torch.bool, device=tokens.device), pos, None,
                     first=first)


@torch.no_grad()
def evaluate_predictor(predictor: Predictor, reader: TraceReader, split: str = "test", *, chunk: int = 32,
                       max_samples: Optional[int] = None, device: torch.device | str = "cpu",
                       drafter: Drafter | None = None, target: Target | None = None,
                       feature_depth: int = 1) -> dict[str, Any]:
    """Top-K overlap accuracy of ``predictor`` (already ``setup``) on ``split`` of the traces.

    ``drafter`` (set up on ``target``) provides the node features of predictors with ``uses_draft_features``.

    Returns:
        ``{"acc": float, "acc_per_layer": [L], "tokens": int, "samples": int}``.
    """
    from specmoe.errors import UserError
    from specmoe.training.routing_metrics import TopKRoutingAccuracy

    uses_features = bool(getattr(predictor, "uses_draft_features", False))
    if uses_features and (drafter is None or target is None):
        raise UserError(f"predictor {type(predictor).__name__} reads the drafter's node features: give a drafter "
                        f"(platform traces evaluate --drafter NAME:KEY=VALUE,...)")
    metric = TopKRoutingAccuracy(reader.meta.num_layers, reader.meta.top_k)
    records = reader.samples(split)[:max_samples]
    for rec in records:
        cols = reader.read(rec)
        ids = cols["token_ids"].to(device)
        gt = cols["routing"].to(device)
        feats = sample_features(drafter, target, ids, feature_depth).to(device) if uses_features else None
        state = predictor.begin(1)
        predictor.observe(state, _committed(ids[:1], 0, True))
        s, scored = 0, 0
        while scored < ids.numel():
            e = min(s + chunk, ids.numel())
            tree = chain_tree(ids[s:e], None if feats is None else feats[s:e])
            sets = predictor.predict(state, tree)[0]  # [n, L, E]
            new = slice(scored - s, e - s)
            metric.update(sets[new].cpu(), gt[scored:e].cpu())
            scored = e
            if e < ids.numel():
                predictor.observe(state, _committed(ids[s + 1:e], s + 1, False))
            s = e - 1
    res = metric.compute()
    return {"acc": float(res["acc"]), "acc_per_layer": [float(a) for a in res["acc_per_layer"]],
            "tokens": int(metric.tokens), "samples": len(records)}


def evaluate_lookup(lookup: Callable[[torch.Tensor], torch.Tensor], reader: TraceReader,
                    split: str = "test") -> dict[str, Any]:
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
