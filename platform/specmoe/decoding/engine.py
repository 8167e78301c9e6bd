# SPDX-License-Identifier: Apache-2.0
"""The speculative decoding loop: draft -> predict -> select -> verify (one target pass) -> accept.

Verification is lossless (:mod:`specmoe.decoding.acceptance`); selectors only choose which nodes are verified.
All rows are verified in one target pass; ``E`` is the union across the batch. A step reads the device twice
(selection width + contract checks; acceptance at T = 0, per node at T > 0); an adaptive selector adds reads for
``plan`` / ``observe``. Timing marks never synchronise; the analysis and the node-value calibration run after the
timed region (``wall_time`` ends before them). The calibration lives as long as the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from specmoe.decoding.acceptance import accept, greedy_paths, greedy_walk, target_probs
from specmoe.decoding.analysis import experts_per_layer, prediction_overlap, routing_stats
from specmoe.decoding.ar_floor import ARFloor
from specmoe.decoding.clock import PhaseClock, device_sync
from specmoe.decoding.inputs import check_generate
from specmoe.decoding.node_values import NodeValues, accepted_in_pool
from specmoe.decoding.records import Generation, StepRecord
from specmoe.decoding.stopping import StopRule
from specmoe.decoding.tree_builder import pool_size
from specmoe.interfaces.drafter import Committed, Drafter
from specmoe.interfaces.kv import KVState
from specmoe.interfaces.predictor import Predictor
from specmoe.interfaces.selection import AdaptiveSelector, SelectionContext, StepOutcome
from specmoe.interfaces.selector import Selector
from specmoe.interfaces.target import Target
from specmoe.interfaces.tree import DraftTree

__all__ = ["SpeculativeEngine", "SelectorError", "experts_per_layer", "pad_rows", "first_token",
           "routing_stats", "prediction_overlap", "StepTrace", "merge_committed"]


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


def first_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """Next token from ``[V]`` logits: argmax at T = 0, else a sample of softmax(logits / T)."""
    if temperature <= 0:
        return int(logits.argmax())
    return int(torch.multinomial(target_probs(logits, temperature), 1, generator=generator))


def next_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None,
                rows: Sequence[int]) -> list[int]:
    """:func:`first_token` of ``logits [B, V]`` for ``rows`` (one host read at T = 0; at T > 0 the rows
    draw in order from ``generator``)."""
    if temperature <= 0:
        best = logits.argmax(dim=-1).tolist()
        return [best[b] for b in rows]
    return [first_token(logits[b], temperature, generator) for b in rows]


def merge_committed(blocks: Sequence[Committed]) -> Committed:
    """One :class:`Committed` of consecutive blocks (each block's valid entries a prefix of its row); one host
    read for several blocks, none for one."""
    if len(blocks) == 1:
        return blocks[0]
    dev = blocks[0].tokens.device
    counts = torch.stack([c.valid.sum(dim=1) for c in blocks], dim=1).tolist()  # [B, blocks]
    offsets = [0]
    for c in blocks[:-1]:
        offsets.append(offsets[-1] + c.tokens.shape[1])
    idx, valid = pad_rows([[o + j for o, n in zip(offsets, row) for j in range(n)] for row in counts], dev)
    cat = lambda ts: torch.cat(ts, dim=1).gather(  # noqa: E731
        1, idx.view(*idx.shape, *[1] * (ts[0].dim() - 2)).expand(*idx.shape, *ts[0].shape[2:]))
    feats = None
    if blocks[0].features is not None:
        feats = cat([c.features for c in blocks]) * valid[:, :, None].to(blocks[0].features.dtype)
    return Committed(cat([c.tokens for c in blocks]) * valid, valid, cat([c.positions for c in blocks]), feats,
                     first=blocks[0].first)



@dataclass
class StepTrace:
    """What a step keeps for its analysis after the timed region (device tensors).

    Attributes:
        routing: ``[B, W, L, K]`` the router's choice in the verification pass.
        valid: ``[B, W]`` verified nodes (padding and finished rows excluded).
        order: ``[B, W]`` pool index of each verified node.
        experts: ``[B, N, L, E]`` predicted sets of the pool (``None`` without predictions).
        selected: ``[B, N]`` the selection.
        kv_slots: cached KV slots per row before the verification pass.
        marks: PhaseClock marks: start, drafted, predicted, selected, verified, end.
    """

    routing: torch.Tensor
    valid: torch.Tensor
    order: torch.Tensor
    experts: torch.Tensor | None
    selected: torch.Tensor
    kv_slots: int
    marks: tuple[int, ...]


@dataclass
class _Run:
    """One generation's state, shared by its steps.

    Attributes:
        pending: committed blocks the drafter (and predictor) have not absorbed yet.
        last_tok: each row's last committed token (the next step's root).
        ar_pos: during a stretch of AR steps, ``[B]`` the position of each row's next root.
        ar_steps: AR steps not yet handed to the drafter: (each row's new token, ``[B, 1]`` rows verified,
            ``[B, 1, F]`` features or ``None``).
    """

    bsz: int
    kv: KVState
    gen: torch.Generator
    clock: PhaseClock
    temperature: float
    stop: StopRule
    feat_layers: Sequence[int]
    outputs: list[list[int]]
    active: list[bool]
    active_t: torch.Tensor
    last_tok: list[int]
    pending: list[Committed]
    ar_attend: torch.Tensor
    n_ar: int = 0
    records: list[StepRecord] = field(default_factory=list)
    traces: list[StepTrace] = field(default_factory=list)
    ar_pos: torch.Tensor | None = None
    ar_steps: list[tuple[list[int], torch.Tensor, torch.Tensor | None]] = field(default_factory=list)


class SpeculativeEngine:
    """Runs tree speculative decoding of ``target`` with the given components.

    Args:
        drafter: proposes candidate pools (already ``setup`` on the target).
        predictor: expert-set predictor (needed when ``selector.needs_experts``).
        clock: host clock for the phase timings on non-CUDA devices (default ``time.perf_counter``).
        ar_floor: the AR floor policy (default: the one an adaptive selector asks for in ``ar_floor``, else none).
    """

    def __init__(self, target: Target, drafter: Drafter, selector: Selector,
                 predictor: Predictor | None = None, clock: Callable[[], float] | None = None,
                 ar_floor: ARFloor | None = None) -> None:
        if selector.needs_experts and predictor is None:
            raise ValueError(f"selector {type(selector).__name__} needs expert predictions: give a predictor")
        self.target = target
        self.drafter = drafter
        self.selector = selector
        self.predictor = predictor
        self.clock = clock
        self.adaptive = isinstance(selector, AdaptiveSelector)
        opts = selector.ar_floor if self.adaptive else None
        if ar_floor is None and opts is not None:
            ar_floor = ARFloor(opts.margin, opts.probe_after, opts.probe_max, tolerance=opts.tolerance)
        if ar_floor is not None and not self.adaptive:
            raise ValueError(f"an AR floor needs an adaptive selector (one with plan/observe); "
                             f"{type(selector).__name__} is not")
        self.floor = ar_floor
        #: node-value calibration of a selector that ranks by it (None otherwise)
        self.values = NodeValues() if getattr(selector, "node_values", False) else None

    # ------------------------------------------------------------------ helpers
    def _selection_width(self, tree: DraftTree, sel: torch.Tensor, budget: int) -> tuple[int, int]:
        """``(width, total)`` selected nodes of the longest row and of all rows, after checking the selector's
        contract (one host read)."""
        name = type(self.selector).__name__
        if sel.shape != tree.tokens.shape or sel.dtype != torch.bool:
            raise SelectorError(f"selector {name} returned {tuple(sel.shape)} {sel.dtype}; expected "
                                f"{tuple(tree.tokens.shape)} bool")
        counts = sel.sum(dim=1)
        # one flag for every violation; which one is worked out only when it is raised
        par_ok = sel.gather(1, tree.parents.clamp(min=0)) | (tree.parents < 0)
        bad = (sel & ~(tree.valid & par_ok)).any() | (tree.valid[:, 0] & ~sel[:, 0]).any()
        width, bad, total = torch.stack([counts.max(), bad, counts.sum()]).tolist()
        if bad:
            if bool((sel & ~tree.valid).any()):
                raise SelectorError(f"selector {name} selected padding (invalid) nodes")
            raise SelectorError(f"selector {name} returned a node set that is not ancestor-closed or lacks "
                                f"the root (every selected node's parent must be selected)")
        if width > budget:
            raise SelectorError(f"selector {name} selected more than budget={budget} nodes")
        return max(int(width), 1), int(total)

    @staticmethod
    def _accept(vt: DraftTree, logits: torch.Tensor, temperature: float, gen: torch.Generator,
                rows: Sequence[int]) -> dict[int, tuple[list[int], list[int]]]:
        """``{row: (accepted node indices, committed tokens)}`` for the active ``rows``."""
        if temperature <= 0 and logits.device.type == "cpu":
            # sequential walk on the host; the tensor form below (no host sync) is for accelerators
            best = logits.argmax(dim=-1)
            w = best.shape[1]
            host = torch.cat([best, vt.tokens, vt.parents, vt.valid.long()], dim=1).tolist()  # one host read
            out = {}
            for b in rows:
                h = host[b]
                a = greedy_walk(h[:w], h[w:2 * w], h[2 * w:3 * w], h[3 * w:])
                out[b] = (a.path, [h[w + i] for i in a.path[1:]] + [a.bonus])
            return out
        if temperature <= 0:
            path, bonus = greedy_paths(vt.tokens, vt.parents, vt.valid, vt.ancestors(), logits)
            host = torch.cat([path.long(), vt.tokens, bonus[:, None]], dim=1).tolist()  # one host read
            w = path.shape[1]
            out = {}
            for b in rows:
                flags, toks = host[b][:w], host[b][w:2 * w]
                nodes = [i for i in range(w) if flags[i]]
                out[b] = (nodes, [toks[i] for i in nodes[1:]] + [host[b][-1]])
            return out
        out = {}
        for b in rows:
            res = accept(vt.tokens[b], vt.parents[b], vt.valid[b], logits[b], temperature, gen)
            out[b] = (res.path, vt.tokens[b, res.path[1:]].tolist() + [res.bonus])
        return out

    # ------------------------------------------------------------------ main loop
    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], *, budget: int, steps: int, top_k: int,
                 temperature: float, stop: StopRule, seed: int = 0,
                 buffer: torch.Tensor | None = None) -> Generation:
        """Generate continuations of ``prompts`` (token id lists) in one batch."""
        check_generate(self, prompts, budget=budget, steps=steps, top_k=top_k, temperature=temperature, stop=stop,
                       seed=seed, buffer=buffer)
        dev = self.target.device
        clock = PhaseClock(dev, self.clock)
        device_sync(dev)
        start = clock.mark()
        run = self._prefill(prompts, temperature, stop, seed, clock, capacity=pool_size(steps, top_k) + budget)
        prefill_end = clock.mark()
        d_state = self.drafter.begin(run.bsz)
        p_state = self.predictor.begin(run.bsz) if self.predictor is not None else None
        floor = self.floor
        if floor is not None:
            floor.begin(run.bsz, temperature)
        while any(run.active):
            if floor is not None and not floor.speculate():
                self._ar_step(run)
            else:
                self._speculative_step(run, d_state, p_state, budget, steps, top_k, buffer)
        clock.sync()
        end = clock.mark()
        counts_le = self._analyse(run.records, run.traces, clock)
        return Generation(tokens=run.outputs, steps=run.records, wall_time=clock.seconds(start, end),
                          prefill_time=clock.seconds(start, prefill_end), expert_counts=counts_le.tolist())

    def _prefill(self, prompts: Sequence[Sequence[int]], temperature: float, stop: StopRule, seed: int,
                 clock: PhaseClock, capacity: int) -> "_Run":
        """The prompt in one pass; the first token comes from the target (``capacity``: KV slots a step may add)."""
        target = self.target
        dev = target.device
        bsz = len(prompts)
        gen = torch.Generator(device=dev).manual_seed(seed)
        feat_layers = self.drafter.feature_layers
        lens = [len(p) for p in prompts]
        kv = target.new_kv(bsz, capacity=max(lens) + stop.max_new_tokens + capacity)
        ids, valid = pad_rows(prompts, dev)
        m = ids.shape[1]
        pos = torch.arange(m, device=dev).expand(bsz, m)
        last = torch.tensor(lens, device=dev)[:, None] - 1
        out = target.forward(ids, kv, pos, None, valid, hidden_layers=feat_layers, logits_at=last)
        outputs: list[list[int]] = [[] for _ in range(bsz)]
        active = [True] * bsz
        roots = next_tokens(out.logits[:, 0], temperature, gen, range(bsz))
        for b, tok in enumerate(roots):
            if stop.extend(outputs[b], [tok]):
                active[b] = False
        c_ids, c_valid = pad_rows([list(p) + [r] for p, r in zip(prompts, roots)], dev)
        feats = None
        if feat_layers:
            h = out.hidden  # [B, m, F]; token i's feature is the hidden state at position i - 1
            feats = torch.zeros(bsz, c_ids.shape[1], h.shape[-1], dtype=h.dtype, device=dev)
            feats[:, 1:m + 1] = h
        pending = [Committed(c_ids, c_valid, torch.arange(c_ids.shape[1], device=dev).expand_as(c_ids),
                             feats, first=True)]
        return _Run(bsz=bsz, kv=kv, gen=gen, clock=clock, temperature=temperature, stop=stop,
                    feat_layers=feat_layers, outputs=outputs, active=active, active_t=torch.tensor(active, device=dev),
                    last_tok=list(roots), pending=pending,
                    ar_attend=torch.ones(bsz, 1, 1, dtype=torch.bool, device=dev))

    def _ar_step(self, run: "_Run") -> None:
        """One AR step under the floor: each active row's root alone in one target pass, one host read. The tokens
        wait in ``run.ar_steps``, with this pass's hidden states as features, for the next speculative step."""
        target, kv, clock, floor = self.target, run.kv, run.clock, self.floor
        dev, bsz = target.device, run.bsz
        rows = [b for b in range(bsz) if run.active[b]]
        t0 = clock.mark()
        if run.ar_pos is None:
            run.ar_pos = kv.next_position()
        base, kv_slots = run.ar_pos, kv.num_slots
        sel_ar = run.active_t[:, None]  # [B, 1] the rows verified in this pass
        vout = target.forward(torch.tensor(run.last_tok, device=dev)[:, None], kv, base[:, None], run.ar_attend,
                              sel_ar, hidden_layers=run.feat_layers, capture_routing=True)
        t4 = clock.mark()
        new_rows: list[list[int]] = [[] for _ in range(bsz)]
        for b, tok in zip(rows, next_tokens(vout.logits[:, 0], run.temperature, run.gen, rows)):
            new_rows[b] = [tok]
        if len(rows) < bsz:  # finished rows drop the slot of this pass (with every row active: none)
            kv.keep_last(1, [[0] if run.active[b] else [] for b in range(bsz)])
            run.ar_pos = base + sel_ar[:, 0].long()
        else:
            run.ar_pos = base + 1
        accepted = self._extend(run.outputs, run.active, new_rows, rows, run.stop, run.last_tok)
        h = vout.hidden
        run.ar_steps.append(([r[0] if r else 0 for r in new_rows], sel_ar, None if h is None else h[:, :1]))
        if not all(run.active[b] for b in rows):
            run.active_t = torch.tensor(run.active, device=dev)
        run.n_ar += 1
        if self.adaptive and run.n_ar % floor.observe_every == 0:
            self.selector.observe(StepOutcome(
                rows=bsz, tokens=len(rows), width=1, kv_slots=kv_slots, temperature=run.temperature,
                experts_per_layer=experts_per_layer(vout.routing, sel_ar, target.num_experts),
                t_verify=clock.seconds(t0, t4), speculative=False))
        t5 = clock.mark()
        floor.observe_ar(len(rows), clock.seconds(t0, t5))
        run.records.append(StepRecord(accepted=accepted, verified=[], experts_per_layer=[], speculative=False))
        order = torch.zeros(bsz, 1, dtype=torch.long, device=dev)
        run.traces.append(StepTrace(vout.routing, sel_ar, order, None, sel_ar, kv_slots, (t0, t0, t0, t0, t4, t5)))

    @staticmethod
    def _ar_block(run: "_Run") -> Committed:
        """``run.ar_steps`` as one :class:`Committed` ``[B, steps]`` (valid entries a prefix); empties them and
        ``run.ar_pos``."""
        steps, first = run.ar_steps, run.ar_pos
        dev = first.device
        valid = torch.cat([v for _, v, _ in steps], dim=1)  # [B, w]
        tokens = torch.tensor(list(zip(*(t for t, _, _ in steps))), device=dev).reshape(valid.shape)
        w = valid.shape[1]
        positions = first[:, None] - valid.long().sum(dim=1, keepdim=True) + 1 + torch.arange(w, device=dev)
        feats = None
        if steps[0][2] is not None:
            feats = torch.cat([f for _, _, f in steps], dim=1)
            feats = feats * valid[:, :, None].to(feats.dtype)
        run.ar_steps, run.ar_pos = [], None
        return Committed(tokens * valid, valid, positions, feats)

    def _speculative_step(self, run: "_Run", d_state: object, p_state: object, budget: int, steps: int,
                          top_k: int, buffer: torch.Tensor | None) -> None:
        """Draft -> predict -> select -> verify the selection in one target pass -> accept, prune the caches."""
        target, kv, clock, floor, temperature = self.target, run.kv, run.clock, self.floor, run.temperature
        dev, bsz = target.device, run.bsz
        rows = [b for b in range(bsz) if run.active[b]]
        t0 = clock.mark()
        if run.ar_steps:
            run.pending.append(self._ar_block(run))
        committed = merge_committed(run.pending)
        tree = self.drafter.draft(d_state, committed, steps, top_k)
        tree.valid = tree.valid & run.active_t[:, None]
        t1 = clock.mark()
        experts = None
        if self.predictor is not None:
            self.predictor.observe(p_state, committed)
            if self.selector.needs_experts:
                experts = self.predictor.predict(p_state, tree)
        t2 = clock.mark()
        plan = None
        if self.values is not None:
            tree.value = self.values.values(tree, temperature)
        if self.adaptive:
            ctx = SelectionContext(temperature=temperature, kv_slots=kv.num_slots, t_draft=clock.seconds(t0, t1),
                                   t_pred=clock.seconds(t1, t2), absorbed=committed.tokens.shape[1])
            plan = self.selector.plan(tree, budget, experts, buffer, ctx)
            sel = plan.selected & run.active_t[:, None]
        else:
            sel = self.selector.select(tree, budget, experts, buffer) & run.active_t[:, None]
        width, n_verified = self._selection_width(tree, sel, budget)
        if floor is not None:
            floor.decide(float(plan.expected_tokens.sum()), plan.t_step, len(rows), plan.ar_rate,
                         provisional=plan.provisional, catch_up=plan.catch_up)
        t3 = clock.mark()

        # ---- verify the selected nodes in one target pass
        order = torch.argsort((~sel).to(torch.int8), dim=1, stable=True)[:, :width]
        order_valid = torch.arange(width, device=dev)[None, :] < sel.sum(dim=1)[:, None]
        vt = tree.subset(order, order_valid)
        base = kv.next_position()
        kv_slots = kv.num_slots
        vout = target.forward(vt.tokens, kv, base[:, None] + vt.depth, vt.ancestors(), vt.valid,
                              hidden_layers=run.feat_layers, capture_routing=True)
        t4 = clock.mark()

        # ---- accept, prune caches, stop rules
        acc = self._accept(vt, vout.logits, temperature, run.gen, rows)
        paths: list[list[int]] = [[] for _ in range(bsz)]
        new_rows: list[list[int]] = [[] for _ in range(bsz)]
        for b in rows:
            paths[b], new_rows[b] = acc[b]
        accepted = self._extend(run.outputs, run.active, new_rows, rows, run.stop, run.last_tok)
        kv.keep_last(width, paths)
        run.pending = [self._committed(new_rows, paths, vout.hidden, base, dev)]
        if self.values is not None:
            self.values.record(tree, sel, order, paths, temperature)
        finished = not all(run.active[b] for b in rows)
        if finished:
            run.active_t = torch.tensor(run.active, device=dev)
        if self.adaptive:
            self.selector.observe(self._outcome(tree, sel, order, vt, vout.routing, paths, kv_slots, n_verified,
                                                width, temperature, clock, (t0, t1, t2, t3, t4),
                                                committed.tokens.shape[1]))
        t5 = clock.mark()
        if floor is not None:
            floor.observe_upkeep(clock.seconds(t4, t5))
            floor.observe_step(clock.seconds(t0, t5), sum(accepted), len(rows), truncated=finished)
        run.records.append(StepRecord(accepted=accepted, verified=[], experts_per_layer=[],
                                      uncut=[len(new_rows[b]) for b in rows]))
        run.traces.append(StepTrace(vout.routing, vt.valid, order, experts, sel, kv_slots, (t0, t1, t2, t3, t4, t5)))

    @staticmethod
    def _extend(outputs: list[list[int]], active: list[bool], new_rows: list[list[int]], rows: Sequence[int],
                stop: StopRule, last_tok: list[int]) -> list[int]:
        """Append each active row's new tokens (stop rules applied); returns the tokens appended per row."""
        accepted = []
        for b in rows:
            before = len(outputs[b])
            if stop.extend(outputs[b], new_rows[b]):
                active[b] = False
            accepted.append(len(outputs[b]) - before)
            if new_rows[b]:
                last_tok[b] = new_rows[b][-1]
        return accepted

    def _outcome(self, tree: DraftTree, sel: torch.Tensor, order: torch.Tensor, vt: DraftTree,
                 routing: torch.Tensor, paths: list[list[int]], kv_slots: int, n_verified: int, width: int,
                 temperature: float, clock: PhaseClock, marks: tuple[int, ...], absorbed: int) -> StepOutcome:
        """What a speculative step did, for an adaptive selector (accepted paths mapped back to the pool)."""
        bsz = len(paths)
        accepted = accepted_in_pool(sel, order, paths, width)
        t0, t1, t2, t3, t4 = marks
        return StepOutcome(rows=bsz, tokens=n_verified, width=width, kv_slots=kv_slots, temperature=temperature,
                           experts_per_layer=experts_per_layer(routing, vt.valid, self.target.num_experts),
                           t_verify=clock.seconds(t3, t4), t_draft=clock.seconds(t0, t1),
                           t_pred=clock.seconds(t1, t2), t_select=clock.seconds(t2, t3), absorbed=absorbed,
                           tree=tree, selected=sel,
                           accepted=accepted)

    def _analyse(self, records: list[StepRecord], traces: list[StepTrace], clock: PhaseClock) -> torch.Tensor:
        """Fill the records' timings and analysis fields (after the timed region; flushes the node values);
        returns the ``[L, E]`` activation counts of the verified tokens."""
        if self.values is not None:
            self.values.flush()
        target = self.target
        n_exp = target.num_experts
        counts_le = torch.zeros(target.num_moe_layers, n_exp, dtype=torch.long, device=target.device)
        for rec, tr in zip(records, traces):
            t0, t1, t2, t3, t4, t5 = tr.marks
            rec.t_draft, rec.t_pred, rec.t_select = clock.seconds(t0, t1), clock.seconds(t1, t2), clock.seconds(t2, t3)
            rec.t_verify, rec.t_total = clock.seconds(t3, t4), clock.seconds(t0, t5)
            counts = tr.valid.sum(dim=1).tolist()
            rec.verified = [c for c in counts if c > 0]
            rec.experts_per_layer = experts_per_layer(tr.routing, tr.valid, n_exp)
            rec.pass_experts_per_layer = experts_per_layer(tr.routing, torch.ones_like(tr.valid), n_exp)
            rec.cumulative_experts, step_counts = routing_stats(tr.routing, tr.valid, n_exp)
            counts_le += step_counts
            if tr.experts is not None:
                picked = (tr.experts & tr.selected[:, :, None, None]).any(dim=1).any(dim=0)  # [L, E]
                rec.predicted_per_layer = picked.sum(dim=1).tolist()
                rec.pred_hits, rec.pred_total = prediction_overlap(tr.experts, tr.order, tr.valid, tr.routing)
        return counts_le

    @staticmethod
    def _committed(rows: list[list[int]], paths: list[list[int]], hidden: torch.Tensor | None,
                   base: torch.Tensor, dev: torch.device) -> Committed:
        """The next step's :class:`Committed`: each row's new tokens, with the verification pass's hidden states
        at the accepted path as features."""
        ids, valid = pad_rows(rows, dev)
        positions = base[:, None] + 1 + torch.arange(ids.shape[1], device=dev)[None, :]
        features = None
        if hidden is not None:
            idx, _ = pad_rows(paths, dev)
            features = hidden.gather(1, idx[:, :, None].expand(-1, -1, hidden.shape[-1]))
            features = features * valid[:, :, None].to(features.dtype)
        return Committed(ids, valid, positions, features, first=False)
