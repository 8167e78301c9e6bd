# SPDX-License-Identifier: Apache-2.0
"""The AR floor: take plain autoregressive steps when speculation is expected to be slower, and probe again.

After every speculative step the engine compares the step's expected rate (the selector's
:class:`~specmoe.interfaces.selection.SelectionPlan`: expected tokens over predicted step seconds, plus the
measured upkeep of speculative steps: acceptance, cache pruning) with the *measured* AR rate (active rows per
second of the engine's own recent AR steps at that row count; the selector's predicted AR rate until one was
measured). Below ``margin`` x the AR rate the engine takes AR steps (no drafting, no predictor, no selection),
then probes speculation again with one speculative step.

Probe schedule: exponential back-off in steps, never shorter than what keeps failed probes cheap. A failed probe (a
speculative step whose plan did not pay) lost ``loss = (T_probe x AR rate - tokens) / rows`` AR steps' worth of
tokens, *measured* once the step is over (``T_probe`` its seconds, ``tokens`` what it committed):
:meth:`ARFloor.observe_step`. A probe's seconds hold its catch-up (the plan's ``catch_up``: drafting the prompt, or
the tokens of the AR steps before it, beyond what a step of a speculative stretch drafts), paid once whenever
speculation starts again. Until :data:`EVIDENCE` (4) decided speculative steps of the regime were measured, a
failed probe waits the back-off alone: one step's loss does not tell a bad step (a hard token, the first step of a
generation, a slow moment of the machine) from a regime where speculation does not pay, and charging it ``loss /
tolerance`` from the first step kept the demo's batch-1 regime (where a chain of 5 drafts runs ~1.4x AR) on AR for
150-400 steps after a first probe whose plan underestimated the draft (`bench peer`, fp32: 65 % of a 16-prompt
cell's steps on the floor; 37-86 % in paired runs of 8 generations, Zen 3); the first ``EVIDENCE`` probes cost at
most a few AR steps per regime, whose state lasts for the engine's life. Where speculation then pays (its recent
decided speculative steps, catch-ups left out, committed at least as many tokens as AR steps would have in their
time), a fall-back is a bad step in a good stretch and waits the back-off alone too: charging it ``loss /
tolerance`` kept the demo's batch-2 regime, where speculation beat AR by ~10 %, on AR for ~100 steps after each
such step. Where it does not pay, the whole step is charged, catch-up included: entering speculation costs the
catch-up every time (on the demo at batch 1, drafting the ~600-token prompt costs ~3 AR steps, ~3 % of a 96-token
generation). Charging the catch-up always made the first step of a generation at batch 4 (~10 AR steps' worth) wait
~1,000 steps, the rest of the evaluation cell, where EAGLE-3 beats AR by 5-14 %; never charging it would make every
generation pay it at T = 1, where every fixed γ loses 2-3x. After it the engine waits ``max(backoff, ceil(loss /
tolerance))`` AR steps, where ``backoff`` starts at ``probe_after`` and doubles with each consecutive failure up to
``probe_max``; a probe whose plan pays resets it. So failed probes, beyond a regime's first ``EVIDENCE``, never
cost more than ``tolerance`` of the decoding time (1 % by default, half the issue's 0.98x AR floor: the other half
is for the engine's AR steps, which cost what ``ar``'s do): an expensive probe (an untrained drafter whose step
costs ~10 AR steps and yields ~1 token) waits ~900 steps, while a probe that only just missed (a bad step in a good
stretch) waits ``probe_after`` steps and the back-off handles noise. Cascade and TCP make the same trade between
overhead and reaction time. The state persists across generations of one engine, per (batch size, temperature), so
a new prompt does not pay a fresh series of probes.

Realisation factor: the plan's rate is the selector's forecast, and a forecast can be biased in one regime
(an acceptance model still learning a batch size, a cost model extrapolating to a token count it has not seen
verified). Once ``evidence`` decided steps of the regime were measured, the decision multiplies the plan's rate
by what the recent ones realised against what their plans expected: ``(Σ tokens / Σ steady seconds) / (Σ
expected tokens / Σ planned seconds)`` over the last ``window`` of them (clamped to [0.5, 2]). On the demo at
batch 2, T = 0 the first plans of the regime expected 5.0-5.5 tokens per step where 7-8 were committed, so a
regime where EAGLE-3 at γ = 8 beats AR by ~10 % fell back, and each failed probe's wait (``loss / tolerance``)
kept it on AR for ~300 steps.

The decision is for the whole batch: drafting, prediction and selection are one pass for all rows, so only
the batch can skip them. Within a speculative step the goodput selector already decides per row (a row whose
nodes do not pay verifies its root alone, i.e. takes an AR step inside the batch).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

__all__ = ["ARFloor", "FloorState", "EVIDENCE"]

#: decided speculative steps of a regime before the floor trusts what they show (whether speculation pays, how
#: far the plans are off)
EVIDENCE = 4


@dataclass
class FloorState:
    """Back-off state of one (batch size, temperature) regime."""

    wait: int = 0
    """AR steps left before the next probe."""
    backoff: int = 0
    """AR steps the next failed decision waits (0: ``probe_after``)."""
    ar_seconds: dict[int, deque] = field(default_factory=dict)
    """active rows -> recent AR step seconds."""
    upkeep: deque = field(default_factory=lambda: deque(maxlen=64))
    """recent seconds of speculative steps outside draft / predict / select / verify."""
    failed: bool = False
    """the last speculative step's plan fell back (its measured loss is still to be charged)."""
    decided: bool = False
    """the last speculative step's plan decided (it was not provisional)."""
    realised: deque = field(default_factory=lambda: deque(maxlen=32))
    """recent decided speculative steps: (tokens committed, tokens AR steps would have in their steady seconds)."""
    predicted_ar: float = 0.0
    """the AR rate that decision compared with."""
    catch_up: float = 0.0
    """that decision's catch-up seconds."""
    plan: tuple[float, float] = (0.0, 0.0)
    """that decision's expected tokens and planned seconds (upkeep included)."""
    forecasts: deque = field(default_factory=lambda: deque(maxlen=32))
    """recent decided speculative steps: (tokens committed, steady seconds, expected tokens, planned seconds)."""


class ARFloor:
    """Decides per step whether the engine speculates.

    Args:
        margin: speculate while ``expected rate >= margin x AR rate`` (``0``: never fall back; a huge margin
            falls back after every probe, which forces the schedule, e.g. in tests).
        probe_after: AR steps after the first failed decision.
        probe_max: cap of the doubling back-off.
        tolerance: share of the decoding time failed probes may cost (0: the back-off alone decides).
        window: AR step timings kept per row count.
        observe_every: AR steps reported to the selector's ``observe``: one in this many (its cost model needs
            some plain passes, not all of them, and each report costs a host read of the pass's routing and,
            now and then, a refit: ~7 % of a tiny CPU target's AR step when every step reports).
    """

    def __init__(self, margin: float = 1.0, probe_after: int = 4, probe_max: int = 64, window: int = 64,
                 observe_every: int = 8, tolerance: float = 0.01) -> None:
        if probe_after < 1 or probe_max < probe_after or observe_every < 1:
            raise ValueError(f"AR floor: need 1 <= probe_after <= probe_max and observe_every >= 1, got "
                             f"{probe_after}, {probe_max}, {observe_every}")
        self.margin, self.probe_after, self.probe_max, self.window = margin, probe_after, probe_max, window
        self.observe_every, self.tolerance = observe_every, tolerance
        self._states: dict[tuple[int, float], FloorState] = {}
        self.state = FloorState()
        self.counts = {"speculate": 0, "fall_back": 0, "provisional": 0}
        """decisions taken (for reports)."""

    def begin(self, batch_size: int, temperature: float) -> None:
        """Select the state of a generation's regime."""
        self.state = self._states.setdefault((batch_size, round(float(temperature), 3)), FloorState())

    def speculate(self) -> bool:
        """Whether the next step is speculative (counts down the AR steps before a probe)."""
        if self.state.wait > 0:
            self.state.wait -= 1
            return False
        return True

    def ar_rate(self, rows: int) -> float | None:
        """Measured tokens per second of an AR step with ``rows`` active rows (nearest measured row count)."""
        by_rows = self.state.ar_seconds
        if not by_rows:
            return None
        key = rows if rows in by_rows else min(by_rows, key=lambda r: (abs(r - rows), r))
        return key / statistics.median(by_rows[key])

    def observe_ar(self, rows: int, seconds: float) -> None:
        """A measured AR step of ``rows`` active rows."""
        if seconds > 0 and rows > 0:
            self.state.ar_seconds.setdefault(rows, deque(maxlen=self.window)).append(seconds)

    def observe_upkeep(self, seconds: float) -> None:
        """Seconds of a speculative step spent outside its priced phases (acceptance, cache pruning)."""
        self.state.upkeep.append(max(seconds, 0.0))

    def decide(self, expected_tokens: float, step_seconds: float, rows: int, predicted_ar_rate: float,
               provisional: bool = False, catch_up: float = 0.0) -> bool:
        """After a speculative step's plan: keep speculating (True) or wait before the next probe (False). A
        ``provisional`` plan (its price holds a catch-up cost the selector cannot yet separate) decides
        nothing: the next step speculates and decides. A fall-back waits the back-off now and, once the step
        is over, at least what its measured loss asks (:meth:`observe_step`; ``catch_up``: the seconds of the
        step's catch-up)."""
        st = self.state
        st.failed, st.decided, st.catch_up = False, not provisional, max(catch_up, 0.0)
        if provisional:
            self.counts["provisional"] += 1
            return True
        upkeep = statistics.median(st.upkeep) if st.upkeep else 0.0
        st.plan = (float(expected_tokens), step_seconds + upkeep)
        rate = expected_tokens / max(step_seconds + upkeep, 1e-12) * self.realisation()
        ar = self._ar(rows, predicted_ar_rate)
        keep = rate >= self.margin * ar
        self.counts["speculate" if keep else "fall_back"] += 1
        if keep:
            st.backoff = 0
        else:
            backoff = st.backoff or self.probe_after
            st.backoff = min(2 * backoff, self.probe_max)
            st.wait = backoff
            st.failed = True
        st.predicted_ar = ar
        return keep

    def observe_step(self, seconds: float, tokens: int, rows: int, truncated: bool = False) -> None:
        """A speculative step is over (``seconds`` measured, ``tokens`` committed over ``rows`` active rows):
        recorded for :meth:`pays` and :meth:`realisation` when its plan decided; if its plan fell back and
        :data:`EVIDENCE` decided steps showed that speculation does not pay here, wait at least ``loss /
        tolerance`` AR steps, the catch-up included (else the back-off alone; module docstring). A ``truncated``
        step (a row's stop rule cut its tokens: the last step of a generation often has one token left to commit)
        says nothing about speculation: neither recorded nor charged."""
        st = self.state
        failed, st.failed = st.failed, False
        if not st.decided or truncated:
            return
        ar = self._ar(rows, st.predicted_ar)
        steady_s = max(seconds - st.catch_up, 0.0)
        steady = steady_s * ar  # tokens AR steps would have committed meanwhile
        st.realised.append((float(tokens), steady))
        st.forecasts.append((float(tokens), steady_s, *st.plan))
        if not failed or self.tolerance <= 0:
            return
        if len(st.realised) < EVIDENCE or self.pays():  # not yet known, or a bad step in a paying stretch
            return
        loss = (seconds * ar - tokens) / max(rows, 1)  # AR steps' worth, the catch-up included
        st.wait = max(st.wait, math.ceil(loss / self.tolerance))

    def realisation(self, evidence: int = EVIDENCE) -> float:
        """Realised over planned rate of the regime's recent decided speculative steps (1 until ``evidence``
        steps; clamped to [0.5, 2])."""
        seen = self.state.forecasts
        if len(seen) < evidence:
            return 1.0
        tokens, seconds, expected, planned = (sum(col) for col in zip(*seen))
        if min(seconds, expected, planned) <= 0:
            return 1.0
        return min(max((tokens / seconds) / (expected / planned), 0.5), 2.0)

    def pays(self, evidence: int = EVIDENCE) -> bool:
        """Whether speculation pays in this regime: its recent decided speculative steps committed at least
        the tokens AR steps would have in their time (catch-ups left out); True until ``evidence`` steps."""
        seen = self.state.realised
        return len(seen) < evidence or sum(t for t, _ in seen) >= sum(a for _, a in seen)

    def _ar(self, rows: int, predicted: float) -> float:
        measured = self.ar_rate(rows)
        return measured if measured is not None else predicted
