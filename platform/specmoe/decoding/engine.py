# SPDX-License-Identifier: Apache-2.0
"""The speculative decoding loop: draft -> predict -> select -> verify (one target pass) -> accept.

Verification is standard and lossless (see :mod:`specmoe.decoding.acceptance`); selectors only choose which
tree nodes are verified. With a batch, every row is verified in the same target pass and the expert count
``E`` is the union across the batch.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from specmoe.decoding.acceptance import accept, target_probs
from specmoe.decoding.records import Generation, StepRecord
from specmoe.decoding.stopping import StopRule
from specmoe.interfaces.drafter import Committed, Drafter
from specmoe.interfaces.predictor import Predictor
from specmoe.interfaces.selector import Selector
from specmoe.interfaces.target import Target
from specmoe.interfaces.tree import DraftTree, is_ancestor_closed

__all__ = ["SpeculativeEngine", "SelectorError", "experts_per_layer", "pad_rows", "first_token",
           "routing_stats", "prediction_overlap"]


class SelectorError(RuntimeError):
    """A selector returned an invalid node set."""


def pad_rows(rows: Sequence[Sequence[int]], device: torch.device, fill: int = 0):
    """Right-pad token lists -> ``(ids [B, M], valid [B, M])``."""
    m = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), m), fill, dtype=torch.long)
    valid = torch.zeros(len(rows), m, dtype=torch.bool)
    for b, r in enumerate(rows):
        ids[b, :len(r)] = torch.tensor(list(r), dtype=torch.long)
        valid[b, :len(r)] = True
    return ids.to(device), valid.to(device)


def experts_per_layer(routing: torch.Tensor, valid: torch.Tensor, num_experts: int) -> list[int]:
    """Unique experts per MoE layer over valid tokens: ``routing [B, M, L, K]``, ``valid [B, M]``."""
    r = routing[valid]  # [T, L, K]
    if r.numel() == 0:
        return [0] * routing.shape[2]
    n_layers = r.shape[1]
    hits = torch.zeros(n_layers, num_experts + 1, dtype=torch.bool, device=r.device)
    hits.scatter_(1, r.permute(1, 0, 2).reshape(n_layers, -1).clamp(max=num_experts), True)
    return hits[:, :num_experts].sum(dim=1).tolist()


def routing_stats(routing: torch.Tensor, valid: torch.Tensor, num_experts: int) -> tuple[list[float], torch.Tensor]:
    """Cumulative E over the first k tokens (k = 1..M) and per-expert activation counts ``[L, E]``.

    Args:
        routing: ``[B, M, L, K]`` chosen experts; valid: ``[B, M]``.
    """
    b, m, n_layers, _ = routing.shape
    hits = torch.zeros(b, m, n_layers, num_experts + 1, dtype=torch.bool, device=routing.device)
    hits.scatter_(-1, routing.clamp(max=num_experts), True)
    hits = hits[..., :num_experts] & valid[:, :, None, None]
    cum = hits.cummax(dim=1).values.any(dim=0)  # [M, L, E]
    cumulative = cum.sum(dim=-1).float().mean(dim=-1).tolist()
    return cumulative, hits.sum(dim=(0, 1))


def prediction_overlap(experts: torch.Tensor, order: torch.Tensor, valid: torch.Tensor,
                       routing: torch.Tensor) -> tuple[int, int]:
    """Top-K overlap of predicted and actual experts of the verified nodes.

    Args:
        experts: ``[B, N, L, E]`` predicted sets of the pool; order: ``[B, M]`` pool index of each verified
            node; valid: ``[B, M]``; routing: ``[B, M, L, K]`` the router's choice in the verification pass.

    Returns:
        ``(hits, total)`` with total = valid tokens x L x K.
    """
    b, m = order.shape
    pred = experts.gather(1, order[:, :, None, None].expand(b, m, *experts.shape[2:]))  # [B, M, L, E]
    hit = pred.gather(-1, routing) & valid[:, :, None, None]
    return int(hit.sum()), int(valid.sum()) * routing.shape[2] * routing.shape[3]


def first_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """Next token from ``[V]`` logits: argmax at T = 0, else a sample of softmax(logits / T)."""
    if temperature <= 0:
        return int(logits.argmax())
    return int(torch.multinomial(target_probs(logits, temperature), 1, generator=generator))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SpeculativeEngine:
    """Runs tree speculative decoding of ``target`` with the given components.

    Args:
        target: the MoE model.
        drafter: proposes candidate pools (already ``setup`` on the target).
        selector: chooses the nodes to verify.
        predictor: expert-set predictor (needed when ``selector.needs_experts``).
    """

    def __init__(self, target: Target, drafter: Drafter, selector: Selector,
                 predictor: Predictor | None = None) -> None:
        if selector.needs_experts and predictor is None:
            raise ValueError(f"selector {type(selector).__name__} needs expert predictions: give a predictor")
        self.target = target
        self.drafter = drafter
        self.selector = selector
        self.predictor = predictor

    # ------------------------------------------------------------------ helpers
    def _check_selection(self, tree: DraftTree, sel: torch.Tensor, budget: int) -> None:
        name = type(self.selector).__name__
        active = tree.valid[:, 0]
        if sel.shape != tree.tokens.shape or sel.dtype != torch.bool:
            raise SelectorError(f"selector {name} returned {tuple(sel.shape)} {sel.dtype}; expected "
                                f"{tuple(tree.tokens.shape)} bool")
        if bool((sel & ~tree.valid).any()):
            raise SelectorError(f"selector {name} selected padding (invalid) nodes")
        closed = is_ancestor_closed(tree.parents, sel)
        if bool((~closed & active).any()):
            raise SelectorError(f"selector {name} returned a node set that is not ancestor-closed or lacks "
                                f"the root (every selected node's parent must be selected)")
        if bool((sel.sum(dim=1) > budget).any()):
            raise SelectorError(f"selector {name} selected more than budget={budget} nodes")

    # ------------------------------------------------------------------ main loop
    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], *, budget: int, steps: int, top_k: int,
                 temperature: float, stop: StopRule, seed: int = 0,
                 buffer: torch.Tensor | None = None) -> Generation:
        """Generate continuations of ``prompts`` (token id lists) in one batch."""
        target = self.target
        dev = target.device
        bsz = len(prompts)
        gen = torch.Generator(device=dev).manual_seed(seed)
        feat_layers = self.drafter.feature_layers
        _sync(dev)
        t_start = time.perf_counter()

        # ---- prefill: the prompt, one pass; the first token comes from the target
        kv = target.new_kv(bsz)
        ids, valid = pad_rows(prompts, dev)
        m = ids.shape[1]
        pos = torch.arange(m, device=dev).expand(bsz, m)
        out = target.forward(ids, kv, pos, None, valid, hidden_layers=feat_layers)
        outputs: list[list[int]] = [[] for _ in range(bsz)]
        active = torch.ones(bsz, dtype=torch.bool, device=dev)
        lens = [len(p) for p in prompts]
        roots = []
        for b in range(bsz):
            tok = first_token(out.logits[b, lens[b] - 1], temperature, gen)
            roots.append(tok)
            if stop.extend(outputs[b], [tok]):
                active[b] = False
        committed_rows = [list(p) + [r] for p, r in zip(prompts, roots)]
        c_ids, c_valid = pad_rows(committed_rows, dev)
        feats = None
        if feat_layers:
            h = out.hidden  # [B, m, F]; token i's feature is the hidden state at position i - 1
            feats = torch.zeros(bsz, c_ids.shape[1], h.shape[-1], dtype=h.dtype, device=dev)
            feats[:, 1:m + 1] = h
        committed = Committed(c_ids, c_valid, torch.arange(c_ids.shape[1], device=dev).expand_as(c_ids),
                              feats, first=True)
        _sync(dev)
        prefill_time = time.perf_counter() - t_start

        d_state = self.drafter.begin(bsz)
        p_state = self.predictor.begin(bsz) if self.predictor is not None else None
        records: list[StepRecord] = []
        counts_le = torch.zeros(target.num_moe_layers, target.num_experts, dtype=torch.long, device=dev)
        while bool(active.any()):
            t0 = time.perf_counter()
            tree = self.drafter.draft(d_state, committed, steps, top_k)
            tree.valid = tree.valid & active[:, None]
            _sync(dev)
            t1 = time.perf_counter()
            experts = None
            if self.predictor is not None:
                self.predictor.observe(p_state, committed)
                if self.selector.needs_experts:
                    experts = self.predictor.predict(p_state, tree)
            _sync(dev)
            t2 = time.perf_counter()
            sel = self.selector.select(tree, budget, experts, buffer)
            sel = sel & active[:, None]
            self._check_selection(tree, sel, budget)
            t3 = time.perf_counter()

            # ---- verify the selected nodes in one target pass
            counts = sel.sum(dim=1)
            width = max(int(counts.max()), 1)
            order = torch.argsort((~sel).to(torch.int8), dim=1, stable=True)[:, :width]
            order_valid = torch.arange(width, device=dev)[None, :] < counts[:, None]
            vt = tree.subset(order, order_valid)
            base = kv.next_position()
            positions = base[:, None] + vt.depth
            vout = target.forward(vt.tokens, kv, positions, vt.ancestors(), vt.valid,
                                  hidden_layers=feat_layers, capture_routing=True)
            _sync(dev)
            t4 = time.perf_counter()

            # ---- accept, prune caches, stop rules
            keep = torch.zeros(bsz, width, dtype=torch.bool, device=dev)
            new_rows: list[list[int]] = [[] for _ in range(bsz)]
            feat_rows: list[torch.Tensor | None] = [None] * bsz
            accepted, verified = [], []
            for b in range(bsz):
                if not bool(active[b]):
                    continue
                res = accept(vt.tokens[b], vt.parents[b], vt.valid[b], vout.logits[b], temperature, gen)
                keep[b, res.path] = True
                toks = vt.tokens[b, res.path[1:]].tolist() + [res.bonus]
                new_rows[b] = toks
                if vout.hidden is not None:
                    feat_rows[b] = vout.hidden[b, res.path]
                before = len(outputs[b])
                if stop.extend(outputs[b], toks):
                    active[b] = False
                accepted.append(len(outputs[b]) - before)
                verified.append(int(counts[b]))
            kv.keep_last(width, keep)
            committed = self._committed(new_rows, feat_rows, base, dev)
            e_layers = experts_per_layer(vout.routing, vt.valid, target.num_experts)
            cumulative, step_counts = routing_stats(vout.routing, vt.valid, target.num_experts)
            counts_le += step_counts
            pred_layers, hits, total = None, 0, 0
            if experts is not None:
                picked = (experts & sel[:, :, None, None]).any(dim=1).any(dim=0)  # [L, E]
                pred_layers = picked.sum(dim=1).tolist()
                hits, total = prediction_overlap(experts, order, vt.valid, vout.routing)
            _sync(dev)
            t5 = time.perf_counter()
            records.append(StepRecord(accepted=accepted, verified=verified, experts_per_layer=e_layers,
                                      predicted_per_layer=pred_layers, t_draft=t1 - t0, t_pred=t2 - t1,
                                      t_select=t3 - t2, t_verify=t4 - t3, t_total=t5 - t0,
                                      cumulative_experts=cumulative, pred_hits=hits, pred_total=total,
                                      pass_experts_per_layer=experts_per_layer(
                                          vout.routing, torch.ones_like(vt.valid), target.num_experts)))
        wall = time.perf_counter() - t_start
        return Generation(tokens=outputs, steps=records, wall_time=wall, prefill_time=prefill_time,
                          expert_counts=counts_le.tolist())

    @staticmethod
    def _committed(rows: list[list[int]], feats: list[torch.Tensor | None], base: torch.Tensor,
                   dev: torch.device) -> Committed:
        ids, valid = pad_rows(rows, dev)
        positions = base[:, None] + 1 + torch.arange(ids.shape[1], device=dev)[None, :]
        features = None
        real = [f for f in feats if f is not None]
        if real:
            features = torch.zeros(ids.shape[0], ids.shape[1], real[0].shape[-1], dtype=real[0].dtype, device=dev)
            for b, f in enumerate(feats):
                if f is not None:
                    features[b, :f.shape[0]] = f
        return Committed(ids, valid, positions, features, first=False)
