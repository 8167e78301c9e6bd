# SPDX-License-Identifier: Apache-2.0
"""Phase timing of decoding steps without host synchronisation.

On CUDA a mark records an event on the current stream, read once after the timed region
(:meth:`PhaseClock.seconds`); elsewhere a mark reads the host clock (default ``time.perf_counter``).
"""

from __future__ import annotations

import time
from typing import Callable

import torch

__all__ = ["PhaseClock", "device_sync"]


def device_sync(device: torch.device | str) -> None:
    """Wait for ``device``'s queued work (a no-op off CUDA): the end of a wall-clock timed region."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class PhaseClock:
    """Marks points in time on ``device``; differences are read later (``clock``: host clock off CUDA)."""

    def __init__(self, device: torch.device, clock: Callable[[], float] | None = None) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.clock = clock or time.perf_counter
        self._marks: list = []

    def mark(self) -> int:
        """Record the current point in time; returns its index."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._marks.append(ev)
        else:
            self._marks.append(self.clock())
        return len(self._marks) - 1

    def seconds(self, start: int, end: int) -> float:
        """Seconds between marks ``start`` and ``end`` (on CUDA: waits for ``end`` once)."""
        if self.cuda:
            self._marks[end].synchronize()
            return self._marks[start].elapsed_time(self._marks[end]) / 1e3
        return self._marks[end] - self._marks[start]

    def sync(self) -> None:
        """Wait for the device (the end of a timed region)."""
        if self.cuda:
            torch.cuda.synchronize()
