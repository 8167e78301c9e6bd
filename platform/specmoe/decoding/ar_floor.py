# SPDX-License-Identifier: Apache-2.0
"""The AR floor: take plain autoregressive steps when speculation is expected to be slower, and probe again.

After each speculative step's plan the expected rate (expected tokens / (planned seconds + measured upkeep)) is
compared with the measured AR rate (the selector's predicted one until measured); below ``margin`` x AR rate the
engine takes AR steps, then probes with one speculative step. A failed probe waits ``backoff`` AR steps
(``probe_after``, doubling per consecutive failure up to ``probe_max``; reset by a paying plan), or
``max(backoff, ceil(loss / tolerance))`` with ``loss = (T_probe x AR rate - tokens) / rows`` (catch-up included),
but only once :data:`EVIDENCE` decided steps of the regime show speculation does not pay; so failed probes beyond
those cost at most ``tolerance`` of the decoding time. After ``EVIDENCE`` steps the plan's rate is
also scaled by the realised / planned rate of recent steps (clamped to [0.5, 2]). State persists per (batch
size, temperature) for the engine's life. The decision is for the whole batch (drafting is one pass for all rows).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

__all__ = ["ARFloor", "FloorState", "EVIDENCE"]

#: decided speculative steps of a regime before the floor trusts them (whether speculation pays, plan bias)
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
        margin: speculate while ``expected rate >= margin x AR rate`` (``0``: never fall back).
        probe_after: AR steps after the first failed decision.
        probe_max: cap of the doubling back-off.
        tolerance: share of the decoding time failed probes may cost (0: the back-off alone decides).
        window: AR step timings kept per row count.
        observe_every: one AR step in this many is reported to the selector's ``observe``.
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
        ``provisional`` plan decides nothing (the next step decides). A fall-back waits the back-off now and
        possibly more once :meth:`observe_step` measures its loss (``catch_up``: the step's catch-up seconds)."""
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
        recorded when its plan decided, and a fall-back charged as the module docstring says. A ``truncated``
        step (a stop rule cut a row's tokens) is neither recorded nor charged."""
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
