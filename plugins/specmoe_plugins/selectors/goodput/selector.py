# SPDX-License-Identifier: Apache-2.0
"""``goodput``: verify the nodes that maximise expected tokens per second, pricing the expert union.

Per step, over the whole batch at once, choose ancestor-closed sets S_r (root included, 1 <= |S_r| <= gamma_max)
maximising

    rate(S) = sum_r (1 + sum_{i in S_r \\ root} a_i) / (T_draft + T_pred + T_select + T_verify(shape(S)))

where ``a_i`` is the probability that node i's whole path is accepted (:class:`AcceptanceModel`) and
``T_verify`` the cost model's seconds for the pass (:class:`CostModel`): verified tokens, the predicted expert
union of all rows (sum over MoE layers), cached KV slots. Greedy, like EcoSpec with the cost in seconds: the
expert buffer starts as the roots' predicted experts (plus an initial buffer, whose experts are free), each
pick is the frontier node giving the highest rate once added (its marginal cost is one token plus
``|path experts \\ buffer|`` expert-layers), and the selection stops when the best next node would lower the
rate (``stop: drop``) or, with ``stop: best_prefix``, runs to gamma_max and keeps the best prefix.

``expert_cost: false`` is the token-only ablation (EVICT / vLLM): no predictor, each extra token costs what a
token costs with the expected union growth of a pass of that many tokens (observed, else random routing).

The greedy runs over packed words (:func:`~specmoe.decoding.selection.greedy_packed`, one joint decision for
the batch); at batch 1 a small pool takes the same greedy in plain Python
(:func:`~specmoe.decoding.selection.greedy_scalar`, cheaper where the caches are cold, as inside a step), with
the same float64 arithmetic, so the same selection.

The engine feeds measured T_draft / T_pred through :class:`SelectionContext` and outcomes through
:meth:`observe` (online refits), and takes plain AR steps while the plan's expected rate is below the measured
AR rate (``ar_floor``, :mod:`specmoe.decoding.ar_floor`). Until the first refits the models are the prior:
``cost_model`` (a JSON from ``platform bench goodput_cost`` or the ``calibrate_cost`` stage), ``coefficients``
(seconds per unit, over the JSON or instead of it), else :data:`UNCALIBRATED`; acceptance ``a = P(path)``.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from specmoe.decoding.acceptance_model import AcceptanceModel, temperature_key
from specmoe.decoding.bitsets import pack_sets, popcount_rows
from specmoe.decoding.node_values import path_values_lists
from specmoe.decoding.selection import SCALAR_POOL, PackedPool, ScalarPool, greedy_packed, greedy_scalar
from specmoe.errors import UserError
from specmoe.interfaces.selection import AdaptiveSelector, FloorOptions, SelectionContext, SelectionPlan, StepOutcome
from specmoe.interfaces.tree import DraftTree
from specmoe_plugins.selectors.goodput.cost_model import CostModel, VerifyShape
from specmoe_plugins.selectors.goodput.plan import Pricing

__all__ = ["GoodputSelector", "UNCALIBRATED"]

#: prior seconds per unit without a calibration (orders of magnitude of the tiny CPU demo target)
UNCALIBRATED = {"fixed": 5e-3, "tokens": 5e-4, "expert_layers": 5e-5, "kv_slots": 1e-6}


class GoodputSelector(AdaptiveSelector):
    """Greedy expected-tokens-per-second selection with an expert-union-aware cost model."""

    description = "goodput: max expected tokens/s, cost = T_draft + T_pred + T_select + T_verify(tokens, experts)"

    @dataclass
    class Config:
        gamma_max: Optional[int] = None
        """cap on verified nodes per row, root included (default: the engine's budget)."""
        expert_cost: bool = True
        """price the predicted expert union; false: token-only ablation (needs no predictor)."""
        cost_model: Optional[str] = None
        """cost model JSON (``platform bench goodput_cost``, or the ``calibrate_cost`` stage's)."""
        coefficients: Optional[dict] = None
        """seconds per unit of cost features (``fixed``, ``tokens``, ``expert_layers``, ``kv_slots``, ...)."""
        online: bool = True
        """refit the cost and acceptance models from :meth:`observe`."""
        stop: str = "drop"
        """``drop``: stop when the next node lowers the rate; ``best_prefix``: best prefix of the greedy order."""
        cost_window: int = 256
        cost_prior_weight: float = 1.0e-3
        """pull of the online cost fit towards the prior coefficients (the calibration), in observations' worth
        (see :class:`~.cost_model.CostModel`). Small by default: the window decides. As large as
        ``cost_window``, a calibration keeps the price of pass shapes the window has not seen (larger passes
        than the run has verified), but in the tiny demo's grid it also kept the calibration's level, 10-20 %
        off the engine's own passes (held-out error 8-16 % instead of 2-9 %; AR on 89-100 % of the T = 0
        steps)."""
        acceptance_window: int = 4096
        acceptance_first: bool = True
        """the acceptance model's fifth feature, whether an edge is its parent's likeliest drafted child (as the
        tree selectors' node values): at T = 0 siblings are exclusive and a trained draft's argmax is accepted
        even where its share is about even. On the demo's checkpoints (batch 1, γ 5, pool 4 x 2, GSM8K) the four
        features alone ranked the likeliest child's siblings too high: 2.3-2.9 tokens per speculative step instead
        of 3.8, and 99 % of the steps on the AR floor. ``false``: the four features."""
        ar_floor: bool = True
        """ask the engine for an AR floor: plain AR steps while the expected rate is below the measured AR rate."""
        floor_margin: float = 1.0
        """speculate while expected rate >= floor_margin x AR rate (a huge value forces the probe schedule)."""
        probe_after: int = 4
        """AR steps after the first fall-back before speculation is probed again (doubling per failed probe)."""
        probe_max: int = 64
        """cap of the doubling back-off between probes, in steps."""
        explore: bool = False
        """verify at least each row's likeliest child of the root (when gamma_max >= 2): one token of
        exploration, so the acceptance model keeps seeing outcomes while the rate says drafts do not pay
        (otherwise an under-confident draft is never verified and never found to be good). The plan's rate
        and the AR floor's decision remain those of the greedy choice."""
        explore_outcomes: int = 32
        """until the acceptance model has this many edge outcomes at the step's temperature, each speculative
        step verifies each row's likeliest nodes up to ``gamma_max`` (best first by the model's path acceptance,
        cost aside) and its plan is provisional (the AR floor neither decides nor charges on it). Why: an unfitted
        model takes the draft's probabilities at face value, and an under-confident draft (the demo's EAGLE-3:
        top-1 probability ~0.3 where ~0.85 is accepted) then plans the root alone or one draft, the floor never
        speculates, and no outcome ever corrects the model (``bench peer``, batch 1: 99-100 % of the steps on the
        floor where a chain of 5 drafts ran 1.09x faster than ``ar``). Bounded in steps: at most
        ``ceil(explore_outcomes / (gamma_max - 1))`` exploring steps per engine and temperature (8 at γ 5), i.e.
        about ``explore_outcomes`` verified drafts, however few of them are accepted (a draft that is never
        accepted gives one outcome per step; at T = 1, where every fixed γ can lose 2-3x, the bound is what keeps
        the cost small). 0: off."""
        floor_tolerance: float = 0.01
        """share of the decoding time failed probes may cost: a failed probe is followed by at least
        ``loss / floor_tolerance`` AR steps (0: the back-off alone)."""

    def __init__(self, config=None, **kwargs) -> None:
        super().__init__(config, **kwargs)
        cfg = self.config
        if cfg.stop not in ("drop", "best_prefix"):
            raise UserError(f"selector goodput: stop must be 'drop' or 'best_prefix', got {cfg.stop!r}")
        if not 1 <= cfg.probe_after <= cfg.probe_max:
            raise UserError(f"selector goodput: need 1 <= probe_after <= probe_max, got probe_after="
                            f"{cfg.probe_after}, probe_max={cfg.probe_max}")
        self.ar_floor = (FloorOptions(cfg.floor_margin, cfg.probe_after, cfg.probe_max, cfg.floor_tolerance)
                         if cfg.ar_floor else None)
        d = CostModel.load(cfg.cost_model).to_dict() if cfg.cost_model else {
            **CostModel().to_dict(), "coef": {} if cfg.coefficients is not None else dict(UNCALIBRATED)}
        d["coef"].update(cfg.coefficients or {})
        d["features"] = list(dict.fromkeys([*d["features"], *d["coef"]]))
        try:
            self.cost = CostModel.from_dict(d, window=cfg.cost_window, prior_weight=cfg.cost_prior_weight)
        except ValueError as exc:
            raise UserError(f"selector goodput, coefficients: {exc}") from exc
        self._acceptance = AcceptanceModel(window=cfg.acceptance_window, first=cfg.acceptance_first)
        self._outcomes: list[tuple] = []  # steps' edge outcomes not yet handed to the acceptance model
        self.needs_experts = cfg.expert_cost
        self._unions: dict[int, deque[float]] = {}  # tokens per pass -> observed expert-layers
        self._last_select = 0.0
        self._absorbed: deque[int] = deque(maxlen=64)  # longest accepted path per speculative step
        self._explored: dict[float, int] = {}  # temperature key -> exploring plans (``explore_outcomes``)

    #: speculative steps whose edge outcomes are handed to the acceptance model in one call (its features and
    #: window cost ~0.5 ms per call on the demo's pools, whatever the size; it refits every ~128 outcomes anyway)
    OUTCOME_BATCH = 8

    @property
    def acceptance(self) -> AcceptanceModel:
        """The acceptance model, with every observed step's outcomes in it."""
        self._flush_outcomes()
        return self._acceptance

    def _flush_outcomes(self) -> None:
        if not self._outcomes:
            return
        temperature = self._outcomes[0][-1]
        host = [torch.cat([o[i] for o in self._outcomes], dim=0).cpu().numpy() for i in range(5)]
        self._outcomes.clear()
        self._acceptance.observe_paths(*host, temperature)

    # ---------------------------------------------------------------- pricing helpers
    def expected_expert_layers(self, tokens: int) -> float:
        """Expected expert-layers of a pass of ``tokens`` tokens: observed mean, else random top-k routing
        over the cost model's ``layers`` / ``experts`` / ``top_k`` (0 when those are unknown)."""
        seen = self._unions.get(tokens)
        if seen:
            return statistics.fmean(seen)
        meta = self.cost.meta
        if not all(k in meta for k in ("layers", "experts", "top_k")):
            return 0.0
        e, k = float(meta["experts"]), float(meta["top_k"])
        return float(meta["layers"]) * e * (1.0 - (1.0 - k / e) ** tokens)

    def calibration(self) -> dict:
        """Cost coefficients, window (in-sample) and held-out errors and the window's (predicted, measured)
        T_verify pairs; acceptance weights and calibration (Brier, ECE) per temperature."""
        acc = {str(t): {"weights": self.acceptance.weights_for(t).tolist(), **self.acceptance.calibration(t)}
               for t in self.acceptance.temperatures()}
        pred, meas = self.cost.window_pairs()
        return {"cost": {"coef": self.cost.coefficients(), **self.cost.window_errors(),
                         "heldout": self.cost.heldout_errors(), "predicted": pred, "measured": meas},
                "acceptance": acc}

    def steady_absorbed(self) -> int:
        """Committed tokens per row a step of a speculative stretch absorbs: the median, over recent steps, of
        the longest accepted path (+ bonus) of the step before (2 before any was seen)."""
        return int(statistics.median(self._absorbed)) if self._absorbed else 2

    def _fixed_seconds(self, ctx: SelectionContext, rows: int) -> tuple[float, bool, float]:
        """``T_draft + T_pred + T_select`` of a step of a speculative stretch, whether that is provisional, and
        the measured seconds it left out (the catch-up).

        The plan prices the steps to come, not the one in hand (its draft and prediction are paid when the plan
        is made): each part is the cost model's ``a + b * absorbed`` at the stretch's width where that fit is
        below this step's measurement (a slow moment of the machine, or a catch-up), else the measurement (a fit
        can be far off: one compiling first step in its window made it 0.2-0.3 s for ~8 ms drafts). A step that
        absorbed more committed tokens than a speculative stretch does (the prompt, or the tokens of AR steps)
        measured a catch-up that the steps to come will not pay: what it measured beyond the fit is the
        catch-up. Without a fit the measured seconds are used, and a catch-up step's price is provisional (an AR
        floor does not decide on it). Pricing a steady step by its measurement alone made one slow draft a
        fall-back: on the demo at batch 1 the plans that fell back priced 33-41 ms for steps of ~25 ms, and every
        fall-back waits the back-off."""
        cm, steady = self.cost, self.steady_absorbed()
        total, provisional, catch_up = cm.predict_part("t_select", rows), False, 0.0
        catching_up = ctx.absorbed is not None and ctx.absorbed > steady
        for part, measured in (("t_draft", ctx.t_draft), ("t_pred", ctx.t_pred)):
            if measured is None:
                total += cm.predict_part(part, rows, absorbed=steady)
                continue
            fit = cm.part_at(part, rows, steady)
            if fit is None:
                provisional = provisional or (catching_up and measured > 0)
                total += measured
                continue
            if catching_up and fit < measured:
                catch_up += measured - fit
            total += min(fit, measured)
        return total, provisional, catch_up

    # ---------------------------------------------------------------- selection
    def plan(self, tree: DraftTree, budget: int, experts: torch.Tensor | None = None,
             buffer: torch.Tensor | None = None, context: SelectionContext | None = None) -> SelectionPlan:
        t_start = time.perf_counter()
        cfg = self.config
        ctx = context or SelectionContext()
        if cfg.expert_cost and experts is None:
            raise ValueError("goodput needs predicted expert sets (or expert_cost: false)")
        gmax = min(budget, cfg.gamma_max) if cfg.gamma_max else budget
        b, n = tree.tokens.shape
        parents, valid = tree.parents.detach().cpu().numpy(), tree.valid.detach().cpu().numpy()
        live = valid[:, 0]
        n_live = int(live.sum())
        if n_live == 0:
            self.last_plan = SelectionPlan(torch.zeros(b, n, dtype=torch.bool, device=tree.tokens.device),
                                           torch.zeros(b, dtype=torch.float64), 0.0, 0.0, 0.0, 0.0)
            return self.last_plan
        sets = experts if cfg.expert_cost else None
        # batch 1: the joint greedy is the per-row one, and a small pool is cheaper in plain Python
        scalar = (ScalarPool.build(tree, sets, parents=parents, valid=valid) if b == 1 and n <= SCALAR_POOL
                  else None)
        pool = PackedPool.build(tree, sets) if scalar is None else None
        acc = self.path_acceptance(tree, ctx.temperature, small=scalar is not None).reshape(-1)
        b0, e0 = self._roots_experts(experts, buffer, scalar, pool, live, n_live)
        t_fixed, provisional, catch_up = self._fixed_seconds(ctx, b)
        t_ar = self.cost.predict_verify(VerifyShape(tokens=n_live, expert_layers=e0, rows=b, width=1,
                                                    kv_slots=ctx.kv_slots))
        price = Pricing(self.cost, live.astype(np.int64), n, kv_slots=ctx.kv_slots, t_fixed=t_fixed, t_ar=t_ar,
                        e0=e0, union_growth=None if cfg.expert_cost else self.expected_expert_layers,
                        stop_drop=cfg.stop == "drop")
        if scalar is not None:
            acc_row = acc.tolist()
            sel = greedy_scalar(scalar, gmax, lambda r, i, new: price.rate(acc_row[r * n + i], r, new),
                                buffer=0 if b0 is None else int.from_bytes(b0.tobytes(), "little"),
                                take=lambda f, new: price.take(f, acc_row[f], new), shape=(b, n))
        else:
            sel = greedy_packed(pool, gmax, lambda idx, new: price.rate(acc[idx], idx // n, new), buffer=b0,
                                shared=True, joint=True, take=lambda f, new: price.take(f, acc[f], new))
        if cfg.stop == "best_prefix":
            rate, t_verify = price.best_prefix(sel, n_live, t_ar)
        else:
            rate, t_verify = price.a / price.t, price.t - t_fixed
        if cfg.explore and gmax >= 2:
            self._explore(sel, parents, valid, live, acc)
        key = temperature_key(ctx.temperature)
        if (gmax >= 2 and self._explored.get(key, 0) < -(-cfg.explore_outcomes // (gmax - 1))
                and self.acceptance.outcomes(ctx.temperature) < cfg.explore_outcomes):
            self._explored[key] = self._explored.get(key, 0) + 1
            self._likeliest(sel, parents, valid, live, acc, gmax)
            provisional = True
        flat = sel.reshape(-1).copy()
        flat[np.arange(b) * n] = False
        exp_tokens = live + np.bincount(np.flatnonzero(flat) // n, acc[flat], minlength=b)
        self._last_select = time.perf_counter() - t_start
        self.last_plan = SelectionPlan(
            selected=torch.from_numpy(sel).to(tree.tokens.device), expected_tokens=torch.from_numpy(exp_tokens),
            t_verify=float(t_verify), t_step=float(t_fixed + t_verify), expected_rate=float(rate),
            ar_rate=n_live / t_ar if t_ar > 0 else float("inf"), provisional=provisional, catch_up=catch_up)
        return self.last_plan

    def path_acceptance(self, tree: DraftTree, temperature: float, small: bool | None = None) -> np.ndarray:
        """``[B, N]`` float64 path acceptances the plan prices (:meth:`AcceptanceModel.predict_paths`); for a
        small pool (``small``, default: batch 1 of at most ``SCALAR_POOL`` nodes, where the plan's greedy runs in
        plain Python too) the same values in plain Python (:func:`~specmoe.decoding.node_values.path_values_lists`,
        ~60 against ~300-450 µs for the demo's 11-node pool on a Zen 3 core)."""
        if small is None:
            small = tree.batch_size == 1 and tree.num_nodes <= SCALAR_POOL
        if small:
            return np.asarray(path_values_lists(tree, self._acceptance.weights_for(temperature)), dtype=np.float64)
        return self._acceptance.predict_paths(tree.path_logp.detach().cpu().numpy(),
                                             tree.parents.detach().cpu().numpy(),
                                             tree.depth.detach().cpu().numpy(), temperature)

    def _roots_experts(self, experts: torch.Tensor | None, buffer: torch.Tensor | None,
                       scalar: ScalarPool | None, pool: PackedPool | None, live: np.ndarray,
                       n_live: int) -> tuple[np.ndarray | None, float]:
        """The packed initial buffer (``None``: none) and the expert-layers of the roots' pass beyond it
        (token-only: the expected union of ``n_live`` tokens)."""
        if not self.config.expert_cost:
            return None, self.expected_expert_layers(n_live)
        b0 = pack_sets(buffer.reshape(experts.shape[-2:])) if buffer is not None else None
        if scalar is not None:
            b0_bits = 0 if b0 is None else int.from_bytes(b0.tobytes(), "little")
            return b0, float((scalar.paths[0][0] & ~b0_bits).bit_count())
        roots = np.bitwise_or.reduce(pool.paths[live, 0], axis=0)
        return b0, float(popcount_rows(roots & ~b0) if b0 is not None else popcount_rows(roots))

    @staticmethod
    def _explore(sel: np.ndarray, parents: np.ndarray, valid: np.ndarray, live: np.ndarray,
                 acc: np.ndarray) -> None:
        """``explore``: a live row that verifies its root alone also verifies its likeliest child (in place)."""
        kids = (parents == 0) & valid  # [B, N] depth-1 nodes
        lone = live & (sel.sum(axis=1) == 1) & kids.any(axis=1)
        if lone.any():
            best = np.where(kids, acc.reshape(sel.shape), -1.0).argmax(axis=1)
            sel[np.flatnonzero(lone), best[lone]] = True

    @staticmethod
    def _likeliest(sel: np.ndarray, parents: np.ndarray, valid: np.ndarray, live: np.ndarray, acc: np.ndarray,
                   gmax: int) -> None:
        """``explore_outcomes``: grow each live row's selection (in place, ancestor-closed) to ``gmax`` nodes, each
        time the frontier node of the highest path acceptance."""
        b, n = sel.shape
        values = acc.reshape(b, n)
        for r in np.flatnonzero(live):
            while sel[r].sum() < gmax:
                frontier = valid[r] & ~sel[r] & (parents[r] >= 0) & sel[r][np.maximum(parents[r], 0)]
                if not frontier.any():
                    break
                sel[r, int(np.where(frontier, values[r], -1.0).argmax())] = True

    # ---------------------------------------------------------------- feedback
    def observe(self, outcome: StepOutcome) -> None:
        if not self.config.online:
            return
        el = float(sum(outcome.experts_per_layer))
        self.cost.observe_verify(VerifyShape(tokens=outcome.tokens, expert_layers=el, rows=outcome.rows,
                                             width=outcome.width, kv_slots=outcome.kv_slots), outcome.t_verify)
        self._unions.setdefault(outcome.tokens, deque(maxlen=self.config.cost_window)).append(el)
        if not outcome.speculative:
            return
        t_select = outcome.t_select if outcome.t_select is not None else self._last_select
        self.cost.observe_parts(outcome.rows, t_draft=outcome.t_draft, t_pred=outcome.t_pred,
                                absorbed=outcome.absorbed)
        self.cost.observe_parts(outcome.rows, t_select=t_select)
        if outcome.accepted is not None:
            self._absorbed.append(int(outcome.accepted.sum(dim=1).max()))
        if outcome.tree is not None and outcome.selected is not None and outcome.accepted is not None:
            tree = outcome.tree
            if self._outcomes and (self._outcomes[0][0].shape[1:] != tree.path_logp.shape[1:]
                                   or self._outcomes[0][-1] != outcome.temperature):
                self._flush_outcomes()
            self._outcomes.append((tree.path_logp.detach(), tree.parents.detach(), tree.depth.detach(),
                                   (outcome.selected & tree.valid).detach(), outcome.accepted.detach(),
                                   outcome.temperature))
            if len(self._outcomes) >= self.OUTCOME_BATCH:
                self._flush_outcomes()
