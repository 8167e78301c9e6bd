# SPDX-License-Identifier: Apache-2.0
"""One evaluation group: AR and every (method, γ) of a recipe on one dataset at one (temperature, batch size).

Members run each prompt batch one after another, rotated (round ``r`` of batch ``i`` starts with member
``(i R + r) mod n``), so each speedup is against AR on the same prompts. Each batch runs R = ``eval.repeats``
times per member with the same seed; the fastest round counts, whole (timing noise only adds time), and
``eval.prompts_for_margin`` adds prompt batches while a speedup interval is too wide (:meth:`EvalGroup._grow`).

Resumption: each finished batch (all members) is stored in ``<dir>/batch-<i>.json``, so a killed run redoes at
most the batch in flight and makes the same growth decisions; ``<dir>/cells.json`` holds the finished cells.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from specmoe.decoding.settings import DecodeSettings
from specmoe.errors import CellFailed
from specmoe.evaluation.cell import build_cell, run_batch, warm_up
from specmoe.evaluation.results import CellResult
from specmoe.evaluation.stats import MIN_BATCHES, add_intervals, batches_for_margin
from specmoe.interfaces.dataset import Sample
from specmoe.metrics import derive
from specmoe.utils.files import atomic_write_json

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = ["Member", "EvalGroup"]

logger = logging.getLogger(__name__)
CELLS = "cells.json"


@dataclass
class Member:
    """One method at one γ inside a group (AR: ``budget`` 1, ``autoregressive`` True)."""

    name: str
    budget: int
    build: Callable[[], Any]
    """returns the :class:`~specmoe.evaluation.method.Method` (built on first use)."""
    autoregressive: bool = False
    analysis_only: bool = False
    adaptive: bool = False
    """the method's selector is adaptive (compared with the best fixed-γ method of its cell)."""

    @property
    def id(self) -> str:
        return f"{self.name}@{self.budget}"


class EvalGroup:
    """Runs (or reads back) one group.

    Args:
        directory: the group's cache directory (its name is the group key).
        members: AR first, then the methods.
        decoding: base settings (``steps``, ``top_k``, ``stop``); budget, temperature and seed are replaced.
        warmup, seed: untimed generations per member before its first timed batch; sampling seed.
        repeats: timed rounds of every prompt batch per member (the fastest counts).
        target_facts: ``bytes_per_expert`` (stored), ``bytes_per_expert_loaded``, ``num_moe_layers``.
        margin, max_prompts, more: ``eval.prompts_for_margin`` (None: measure ``samples`` only),
            ``eval.max_prompts`` and the dataset's further prompts (loaded on first need).
    """

    def __init__(self, directory: Path, members: Sequence[Member], samples: Sequence[Sample], *, dataset: str,
                 temperature: float, batch_size: int, render: Callable, decode: Callable, decoding: DecodeSettings,
                 warmup: int, seed: int, target_facts: dict[str, int], progress: tqdm | None = None,
                 repeats: int = 1, margin: float | None = None, max_prompts: int = 0,
                 more: Callable[[], Sequence[Sample]] | None = None) -> None:
        self.dir = Path(directory)
        self.members = list(members)
        self.samples = list(samples)
        self.dataset, self.temperature, self.batch_size = dataset, temperature, batch_size
        self.render, self.decode = render, decode
        self.decoding, self.warmup, self.seed = decoding, warmup, seed
        self.facts = target_facts
        self.progress = progress
        self.repeats = max(int(repeats), 1)
        self.margin, self.max_prompts, self.more = margin, int(max_prompts), more
        bs = self.batch_size
        self._plan = [self.samples[i:i + bs] for i in range(0, len(self.samples), bs)]
        self._pool: list[Sample] | None = None

    @property
    def key(self) -> str:
        return self.dir.name

    def batches(self) -> list[list[Sample]]:
        """The prompt batches measured so far (the listed samples, then the ones growth added)."""
        return self._plan

    def is_done(self) -> bool:
        return (self.dir / CELLS).is_file()

    def load(self) -> list[CellResult]:
        cells = [CellResult.from_json(d) for d in json.loads((self.dir / CELLS).read_text())]
        for c in cells:
            c.cached = True
        return cells

    def _batch_file(self, i: int) -> Path:
        return self.dir / f"batch-{i:05d}.json"

    def run(self) -> list[CellResult]:
        """The group's cells: read back when finished, else measured (resuming after the last stored batch)."""
        if self.is_done():
            self._tick(self.generations())
            return self.load()
        self.dir.mkdir(parents=True, exist_ok=True)
        stored = sum(self._batch_file(i).is_file() for i in range(len(self.batches())))
        if stored:
            logger.info("evaluation group %s: %d of %d prompt batches already measured; continuing", self.key,
                        stored, len(self.batches()))
        done: dict[int, dict[str, Any]] = {}
        warmed: set[str] = set()
        while True:
            for i, batch in enumerate(self.batches()):
                if i not in done:
                    done[i] = self._measure(i, batch, warmed)
            cells = self._cells([done[i] for i in range(len(self.batches()))])
            if self.margin is None or not self._grow(cells):
                break
        atomic_write_json(self.dir / CELLS, [c.to_json() for c in cells])
        for i in range(len(self.batches())):
            self._batch_file(i).unlink(missing_ok=True)
        return cells

    def _measure(self, i: int, batch: list[Sample], warmed: set[str]) -> dict[str, Any]:
        """Batch ``i``: read back when stored, else every member on it (rotated), stored."""
        path = self._batch_file(i)
        if path.is_file():
            self._tick(len(batch) * len(self.members) * self.repeats)
            return json.loads(path.read_text())
        n = len(self.members)
        records: dict[str, dict[str, Any]] = {}
        rounds: dict[str, list[float]] = {m.id: [] for m in self.members}
        for r in range(self.repeats):
            k = (i * self.repeats + r) % n
            for m in self.members[k:] + self.members[:k]:  # rotated: nobody always runs first
                rec = self._run(m, batch, i, warmed)
                rounds[m.id].append(rec["seconds"])
                if m.id not in records or rec["seconds"] < records[m.id]["seconds"]:
                    records[m.id] = rec
                self._tick(len(batch))
        if self.repeats > 1:
            for m_id, rec in records.items():
                rec["round_seconds"] = rounds[m_id]
        atomic_write_json(path, records)
        return records

    def _grow(self, cells: list[CellResult]) -> int:
        """Add prompt batches while some speedup interval over AR is wider than ±margin, as many as the observed
        spread needs (:func:`~specmoe.evaluation.stats.batches_for_margin`, at most 4x per step; ``MIN_BATCHES``
        without an interval), up to ``max_prompts``; returns the prompts added (0: resolved, capped or none left)."""
        n = len(self._plan)
        have = sum(len(b) for b in self._plan)
        need = n
        for c in cells:
            if c.autoregressive or c.analysis_only:
                continue
            bounds = c.intervals.get("speedup")
            if bounds is None:
                need = max(need, MIN_BATCHES, n + 1)
            elif (bounds[1] - bounds[0]) / 2 > self.margin:
                need = max(need, batches_for_margin(bounds[0], bounds[1], n, self.margin) or n + 1)
        if need <= n or have >= self.max_prompts:
            if need > n:
                logger.info("evaluation group %s (%s T=%s bs=%d): ±%g not resolved at the cap of %d prompts",
                            self.key, self.dataset, self.temperature, self.batch_size, self.margin, have)
            return 0
        if self._pool is None:
            used = {s.id for b in self._plan for s in b}
            self._pool = [s for s in (self.more() if self.more is not None else []) if s.id not in used]
        take = min(self.max_prompts - have, (min(need, 4 * n) - n) * self.batch_size, len(self._pool))
        extra, self._pool = self._pool[:take], self._pool[take:]
        if not extra:
            logger.info("evaluation group %s: ±%g not resolved with all %d prompts of %s", self.key, self.margin,
                        have, self.dataset)
            return 0
        self._plan += [extra[i:i + self.batch_size] for i in range(0, len(extra), self.batch_size)]
        if self.progress is not None and getattr(self.progress, "total", None) is not None:
            self.progress.total += len(extra) * len(self.members) * self.repeats
            self.progress.refresh()
        logger.info("evaluation group %s (%s T=%s bs=%d): ±%g not resolved at %d prompts; measuring %d more",
                    self.key, self.dataset, self.temperature, self.batch_size, self.margin, have, len(extra))
        return len(extra)

    def generations(self) -> int:
        """Timed generations (prompt batches' samples x members x repeats) of the whole group."""
        return len(self.samples) * len(self.members) * self.repeats

    def _run(self, m: Member, batch: list[Sample], index: int, warmed: set[str]) -> dict[str, Any]:
        settings = self.decoding.replace(budget=m.budget, temperature=self.temperature, seed=self.seed)
        try:
            method = m.build()
            if m.id not in warmed:
                warm_up(method, self.samples[:self.batch_size], self.render, self.warmup, settings)
                warmed.add(m.id)
            return run_batch(method, batch, self.render, self.decode,
                             settings.replace(seed=self.seed + index * 31 * self.batch_size))
        except Exception as exc:
            raise CellFailed(self._label(m), exc) from exc

    def _label(self, m: Member) -> str:
        gamma = "" if m.autoregressive else f" / γ={m.budget}"
        return f"{m.name} / {self.dataset} / T={self.temperature}{gamma} / bs={self.batch_size}"

    def _cells(self, batches: list[dict[str, Any]]) -> list[CellResult]:
        built = []
        for m in self.members:
            cell, data = build_cell([b[m.id] for b in batches], method=m.name, dataset=self.dataset,
                                    temperature=self.temperature, budget=m.budget, batch_size=self.batch_size,
                                    autoregressive=m.autoregressive, analysis_only=m.analysis_only,
                                    adaptive=m.adaptive, **self.facts)
            cell.key = self.key
            built.append((cell, data))
        ar_cell, ar_data = next((c, d) for c, d in built if c.autoregressive)
        for cell, data in built:
            cell.metrics.update(derive(data, ar_data, cell.metrics, ar_cell.metrics, cell.autoregressive))
        cells = [c for c, _ in built]
        add_intervals(cells, seed=self.seed)
        return cells

    def _tick(self, n: int) -> None:
        if self.progress is not None and n:
            self.progress.update(n)

