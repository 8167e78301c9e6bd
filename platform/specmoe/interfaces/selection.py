# SPDX-License-Identifier: Apache-2.0
"""Rate-aware selection: selectors that price their choice in expected tokens per second, and what they exchange.

Per step the engine calls ``plan = selector.plan(...)``, verifies ``plan.selected`` as for any selector
(losslessness never depends on it), then ``selector.observe(StepOutcome.from_record(...))`` (AR steps:
``speculative=False``). An AR floor (:class:`FloorOptions`) compares ``plan.expected_rate`` with the AR rate.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from specmoe.interfaces.selector import Selector
from specmoe.interfaces.tree import DraftTree

__all__ = ["SelectionContext", "SelectionPlan", "StepOutcome", "AdaptiveSelector", "FloorOptions"]


@dataclass(frozen=True)
class SelectionContext:
    """Per-step facts the engine knows when it selects.

    Attributes:
        temperature: sampling temperature of the step (0: greedy).
        kv_slots: cached KV slots per row before verification (the cache's padded length).
        t_draft: seconds this step's drafting took; ``None``: the selector's running estimate.
        t_pred: seconds this step's expert prediction took (0 without a predictor); ``None``: estimate.
        absorbed: committed tokens per row (padded width) the drafter and predictor absorbed before drafting
            (the prompt, tokens of AR steps, or the last step's accepted ones; ``None``: unknown).
    """

    temperature: float = 0.0
    kv_slots: int = 0
    t_draft: float | None = None
    t_pred: float | None = None
    absorbed: int | None = None


@dataclass
class SelectionPlan:
    """A selection and its price.

    Attributes:
        selected: ``[B, N]`` bool, as :meth:`Selector.select` returns (root selected in active rows).
        expected_tokens: ``[B]`` float64 expected committed tokens (``1 + sum`` of the selected non-root nodes'
            predicted acceptance probabilities; 0 for inactive rows).
        t_verify: predicted seconds of the verification pass.
        t_step: predicted seconds of the whole step (draft + predictor + selection + verification).
        expected_rate: ``expected_tokens.sum() / t_step``, tokens per second.
        ar_rate: predicted tokens per second of a plain AR step for the same active rows.
        provisional: the price includes a catch-up cost not yet separable: an AR floor should not decide on it.
        catch_up: measured catch-up seconds of drafting / prediction that ``t_step`` leaves out (0: none).
    """

    selected: torch.Tensor
    expected_tokens: torch.Tensor
    t_verify: float
    t_step: float
    expected_rate: float
    ar_rate: float
    provisional: bool = False
    catch_up: float = 0.0


@dataclass
class StepOutcome:
    """What one step did, for online calibration.

    Attributes:
        rows: batch rows of the verification pass ``B``.
        tokens: tokens verified over all rows, roots included (an AR step: its active rows).
        width: the longest row's verified tokens.
        kv_slots: cached KV slots per row before the pass.
        experts_per_layer: unique experts per MoE layer in the pass (router's choice, union over the batch).
        t_verify: measured seconds of the pass.
        temperature: the step's temperature.
        speculative: False for an AR step (then the draft fields below are ``None``).
        t_draft, t_pred, t_select: measured seconds (``None`` when not measured).
        absorbed: committed tokens per row absorbed before drafting (:class:`SelectionContext`).
        tree: the candidate pool the selection ran on ``[B, N]``.
        selected: ``[B, N]`` bool, the verified nodes.
        accepted: ``[B, N]`` bool, the nodes of each row's accepted path (root included).
    """

    rows: int
    tokens: int
    width: int
    kv_slots: int
    experts_per_layer: Sequence[int]
    t_verify: float
    temperature: float = 0.0
    speculative: bool = True
    t_draft: float | None = None
    t_pred: float | None = None
    t_select: float | None = None
    absorbed: int | None = None
    tree: DraftTree | None = None
    selected: torch.Tensor | None = None
    accepted: torch.Tensor | None = None

    @classmethod
    def from_record(cls, record: Any, *, rows: int, kv_slots: int, temperature: float,
                    tree: DraftTree | None = None, selected: torch.Tensor | None = None,
                    accepted: torch.Tensor | None = None, speculative: bool = True) -> "StepOutcome":
        """From a :class:`~specmoe.decoding.records.StepRecord` plus what the record does not hold."""
        return cls(rows=rows, tokens=int(sum(record.verified)), width=int(max(record.verified, default=0)),
                   kv_slots=kv_slots, experts_per_layer=list(record.experts_per_layer), t_verify=record.t_verify,
                   temperature=temperature, speculative=speculative,
                   t_draft=record.t_draft if speculative else None, t_pred=record.t_pred if speculative else None,
                   t_select=record.t_select if speculative else None, tree=tree, selected=selected,
                   accepted=accepted)


@dataclass(frozen=True)
class FloorOptions:
    """The AR floor an adaptive selector asks the engine for (see :mod:`specmoe.decoding.ar_floor`).

    Attributes:
        margin: speculate while the plan's expected rate >= ``margin`` x the measured AR rate.
        probe_after: AR steps after the first failed decision before speculation is probed again.
        probe_max: cap of the doubling back-off between probes.
        tolerance: share of the decoding time failed probes may cost.
    """

    margin: float = 1.0
    probe_after: int = 4
    probe_max: int = 64
    tolerance: float = 0.01


class AdaptiveSelector(Selector):
    """A selector that prices its choice (:meth:`plan`; ``select`` is ``plan(...).selected``) and learns from
    outcomes (:meth:`observe`). :attr:`ar_floor` (``None``: none) asks for AR steps while speculation is slower."""

    last_plan: SelectionPlan | None = None
    ar_floor: FloorOptions | None = None

    @abstractmethod
    def plan(self, tree: DraftTree, budget: int, experts: torch.Tensor | None = None,
             buffer: torch.Tensor | None = None, context: SelectionContext | None = None) -> SelectionPlan:
        """Choose nodes as :meth:`Selector.select` does and price the choice (see :class:`SelectionPlan`)."""

    def select(self, tree: DraftTree, budget: int, experts: torch.Tensor | None = None,
               buffer: torch.Tensor | None = None) -> torch.Tensor:
        return self.plan(tree, budget, experts, buffer).selected

    def observe(self, outcome: StepOutcome) -> None:
        """Absorb a finished step (speculative or AR). Default: ignore."""

    def calibration(self) -> dict[str, Any]:
        """JSON-able state of the selector's models (coefficients, errors) for reports; default: none."""
        return {}
