# SPDX-License-Identifier: Apache-2.0
"""The AR floor: take plain autoregressive steps when speculation is expected to be slower, and probe again.

After every speculative step the engine compares the step's expected rate (the selector's
:class:`~specmoe.interfaces.selection.SelectionPlan`: expected tokens over predicted step seconds, plus the
measured upkeep of speculative steps: acceptance, cache pruning) with the *measured* AR rate (active rows per
second of the engine's own recent AR steps at that row count; the selector's predicted AR rate until one was
measured). Below ``margin`` x the AR rate the engine takes AR steps (no drafting, no predictor, no selection),
then probes speculation again with one speculative step.

Probe schedule: exponential back-off in steps. The first failed decision waits ``probe_after`` AR steps, each
further consecutive failure doubles the wait up to a cap; a probe whose plan pays resets the wait. A failed
probe costs one speculative step instead of an AR step: ``excess = T_probe / T_AR - 1`` AR steps' worth of
time. The cap is ``max(probe_max, ceil(excess / tolerance))``, so when speculation never pays, probing costs at
most ``tolerance`` of the decoding time once the wait has grown (2 % by default: the issue's 0.98x AR floor),
after ``O(log)`` probes at first; a change for the better is noticed within the cap (64 steps when a probe costs
little more than an AR step; on the CPU demo, where an untrained EAGLE-3 probe costs ~4 AR steps, ~150). Cascade
and TCP make the same trade. The state persists across generations of one engine, per (batch size,
temperature), so a new prompt does not pay a fresh series of probes.

The decision is for the whole batch: drafting, prediction and selection are one pass for all rows, so only
the batch can skip them. Within a speculative step the goodput selector already decides per row (a row whose
nodes do not pay verifies its root alone, i.e. takes an AR step inside the batch).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

__all__ = ["ARFloor", "FloorState"]


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


class ARFloor:
    """Decides per step whether the engine speculates.

    Args:
        margin: speculate while ``expected rate >= margin x AR rate`` (``0``: never fall back; a huge margin
            falls back after every probe, which forces the schedule, e.g. in tests).
        probe_after: AR steps after the first failed decision.
        probe_max: cap of the doubling wait (raised so that probes cost at most ``tolerance`` of the time).
        tolerance: share of the decoding time failed probes may cost when speculation never pays (0: cap at
            ``probe_max``).
        window: AR step timings kept per row count.
        observe_every: AR steps reported to the selector's ``observe``: one in this many (its cost model needs
            some plain passes, not all of them, and each report costs a host read of the pass's routing and,
            now and then, a refit: ~7 % of a tiny CPU target's AR step when every step reports).
    """

    def __init__(self, margin: float = 1.0, probe_after: int = 4, probe_max: int = 64, window: int = 64,
                 observe_every: int = 8, tolerance: float = 0.02) -> None:
        if probe_after < 1 or probe_max < probe_after or observe_every < 1:
            raise ValueError(f"AR floor: need 1 <= probe_after <= probe_max and observe_every >= 1, got "
                             f"{probe_after}, {probe_max}, {observe_every}")
        self.margin, self.probe_after, self.probe_max, self.window = margin, probe_after, probe_max, window
        self.observe_every, self.tolerance = observe_every, tolerance
        self._states: dict[tuple[int, float], FloorState] = {}
        self.state = FloorState()
        self.counts = {"speculate": 0, "fall_back": 0}
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

    def decide(self, expected_tokens: float, step_seconds: float, rows: int, predicted_ar_rate: float) -> bool:
        """After a speculative step's plan: keep speculating (True) or wait before the next probe (False)."""
        st = self.state
        upkeep = statistics.median(st.upkeep) if st.upkeep else 0.0
        rate = expected_tokens / max(step_seconds + upkeep, 1e-12)
        measured = self.ar_rate(rows)
        ar = measured if measured is not None else predicted_ar_rate
        keep = rate >= self.margin * ar
        self.counts["speculate" if keep else "fall_back"] += 1
        if keep:
            st.backoff = 0
        else:
            cap = self.probe_max
            if self.tolerance > 0 and ar > 0:
                excess = (step_seconds + upkeep) * ar / rows - 1.0  # a probe's extra AR steps' worth of time
                cap = max(cap, math.ceil(excess / self.tolerance))
            st.wait = st.backoff or self.probe_after
            st.backoff = min(2 * st.wait, cap)
        return keep
