# SPDX-License-Identifier: Apache-2.0
"""Run a recipe's stages in dependency order, each cached in ``<cache_dir>/stages/<name>-<key>/``.

The key hashes the stage's name, ``version``, options (``"stage:<id>"`` refs replaced by that stage's key) and
:meth:`~specmoe.interfaces.stage.Stage.key_facts`, so an edit recomputes that stage and its dependents only.
One process computes a stage (others wait on its lock). A raise is recorded as ``failed`` (traceback in
``error.log``), :class:`~specmoe.errors.StageIncomplete` as ``incomplete``; neither is done. A rerun resumes killed
or incomplete work, and failed work only while its newest valid checkpoint has budget left (or it keeps none)."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
import traceback
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from specmoe.config.errors import ConfigError, Problem
from specmoe.config.schema import Component, StageSpec
from specmoe.errors import StageFailed, StageIncomplete, describe
from specmoe.stages.state import DONE, ERROR_LOG, read_state, stage_lock, write_state
from specmoe.utils.dist import dist_info, rank_world, wait_for
from specmoe.utils.files import atomic_write, atomic_write_json
from specmoe.utils.hashing import stable_hash

if TYPE_CHECKING:
    from specmoe.interfaces.stage import Stage, StageContext

__all__ = ["StageRunner", "substitute_refs", "split_ref", "STAGE_PREFIX", "rank_world", "stage_key_blob"]

logger = logging.getLogger(__name__)
STAGE_PREFIX = "stage:"


def split_ref(text: str) -> tuple[str, str]:
    """``"stage:<id>/<sub/path>"`` -> ``(id, "sub/path")`` (the sub-path may be empty)."""
    sid, _, sub = text[len(STAGE_PREFIX):].partition("/")
    return sid, sub


def substitute_refs(node: Any, repl: Callable[[str], Any]) -> Any:
    """Deep copy of ``node`` with each ``"stage:<id>[/<sub>]"`` replaced by ``repl(id)`` (+ ``/<sub>`` if a str)."""
    if isinstance(node, str) and node.startswith(STAGE_PREFIX):
        sid, sub = split_ref(node)
        value = repl(sid)
        return f"{value}/{sub}" if sub and isinstance(value, str) else value
    if isinstance(node, Component):  # a stage's typed sub-component (its target, its datasets)
        return Component(node.name, substitute_refs(node.options, repl), node.kind)
    if isinstance(node, dict):
        return {k: substitute_refs(v, repl) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [substitute_refs(v, repl) for v in node]
    return node


def _refs(node: Any) -> set[str]:
    found: set[str] = set()
    substitute_refs(node, lambda ref: found.add(ref))
    return found


#: options that change how a stage runs (progress, guards, threads), not what it computes: not in the cache key
DISPLAY_ONLY_OPTIONS = frozenset({"enable_progress_bar", "max_time", "num_threads"})


def _key_view(node: Any) -> Any:
    """``node`` with dataclasses as dicts and :data:`DISPLAY_ONLY_OPTIONS` dropped, for hashing."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        node = dataclasses.asdict(node)
    if isinstance(node, dict):
        return {k: _key_view(v) for k, v in node.items() if k not in DISPLAY_ONLY_OPTIONS}
    if isinstance(node, (list, tuple)):
        return [_key_view(v) for v in node]
    return node


def stage_key_blob(name: str, version: str, options: Any, facts: dict[str, Any]) -> dict[str, Any]:
    """What a stage's cache key hashes (``facts`` only if any, so stages without facts keep their keys)."""
    blob = {"name": name, "version": version, "options": _key_view(options)}
    if facts:
        blob["facts"] = _key_view(facts)
    return blob


def _torch_threads(n: int | None = None) -> int:
    import torch

    if n is not None:
        torch.set_num_threads(n)
    return torch.get_num_threads()


class StageRunner:
    """Resolves, hashes and runs the recipe's ``stages`` under ``cache_dir`` (``source``: recipe file, for messages)."""

    def __init__(self, stages: list[StageSpec], cache_dir: str | Path, source: str = "") -> None:
        self.specs = {s.id: s for s in stages}
        self.cache_dir = Path(cache_dir)
        self.source = source
        self.order = self._toposort()
        self.keys: dict[str, str] = {}
        self.facts: dict[str, dict[str, Any]] = {}  # per stage: its key_facts, also written to its summary
        for sid in self.order:
            self.keys[sid] = self._key(self.specs[sid])

    def _toposort(self) -> list[str]:
        """Stage ids, each after the stages it references (``graphlib``; ties in recipe order)."""
        graph = {sid: sorted(r for r in _refs(spec.component.options) if r in self.specs)
                 for sid, spec in self.specs.items()}
        try:
            return list(TopologicalSorter(graph).static_order())
        except CycleError as e:
            cyc = " -> ".join(reversed(e.args[1]))  # graphlib lists each node before the one it depends on
            raise ConfigError([Problem(self.source, "stages", f"stages depend on each other in a cycle: {cyc}")]) \
                from None

    def _key(self, spec: StageSpec) -> str:
        cls = spec.component.plugin_class()
        opts = substitute_refs(spec.component.options, lambda ref: f"stage-key:{self.keys[ref]}")
        facts = cls.key_facts(self.resolve(spec.component.options)) if hasattr(cls, "key_facts") else {}
        self.facts[spec.id] = dict(facts or {})
        return stable_hash(stage_key_blob(spec.component.name, getattr(cls, "version", "1"), opts, facts or {}))

    def out_dir(self, sid: str) -> Path:
        return self.cache_dir / "stages" / f"{self.specs[sid].component.name}-{self.keys[sid]}"

    def is_done(self, sid: str) -> bool:
        return (self.out_dir(sid) / DONE).is_file()

    def outputs(self) -> dict[str, Path]:
        return {sid: self.out_dir(sid) for sid in self.order}

    def resolve(self, node: Any) -> Any:
        """Replace ``stage:<id>`` references in ``node`` by output directories."""
        return substitute_refs(node, lambda ref: str(self.out_dir(ref)))

    def label(self, sid: str) -> str:
        return f"stage '{sid}' ({self.specs[sid].component.name})"

    def run(self, ctx: StageContext, only: set[str] | None = None) -> dict[str, dict[str, Any]]:
        """Run every stage (or ``only`` those and their dependencies) not cached yet; returns stage id -> summary
        (``cached: True`` if already done). Raises :class:`StageFailed` (cause chained) when a stage raises."""
        needed = set(self.order) if only is None else self._closure(only)
        summaries: dict[str, dict[str, Any]] = {}
        info = dist_info()
        for sid in self.order:
            if sid not in needed:
                continue
            cls = self.specs[sid].component.plugin_class()
            if info.world > 1 and info.rank != 0 and not getattr(cls, "distributed", False):
                summaries[sid] = self._wait_for(sid)
            elif info.rank != 0:  # distributed stage on a worker: rank 0 holds the lock and records the state
                summaries[sid] = self._run_worker(sid, cls, ctx)
            else:
                with stage_lock(self.out_dir(sid), self.label(sid)):
                    summaries[sid] = self._run_one(sid, cls, ctx)
        return summaries

    def _cached(self, sid: str) -> dict[str, Any]:
        out = self.out_dir(sid)
        summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
        return {**summary, "cached": True, "dir": str(out)}

    def _build(self, sid: str, cls: type) -> Stage:
        return cls(cls.Config(**self.resolve(self.specs[sid].component.options)))

    def _prepare(self, sid: str, stage: Stage, out: Path) -> str:
        """``fresh``, ``resuming`` or ``restarting`` (``out`` emptied: a failure left nothing to resume)."""
        prev = read_state(out) if out.is_dir() else {}
        if not out.is_dir() or not any(out.iterdir()):
            return "fresh"
        if prev.get("state") != "failed":
            return "resuming"  # killed, incomplete, or older work without a state record
        decision = stage.can_resume(out)
        if decision is None:
            from specmoe.training.checkpoints import has_budget_left

            decision = has_budget_left(out, getattr(stage.config, "trainer", None))
        if decision:
            logger.warning("%s: the previous attempt failed (%s); resuming from its checkpoint", self.label(sid),
                           prev.get("reason", "?"))
            return "resuming"
        logger.warning("%s: the previous attempt failed (%s) and left nothing to resume (no valid checkpoint "
                       "with budget left): restarting it cleanly", self.label(sid), prev.get("reason", "?"))
        keep = {"attempt": prev.get("attempt", 0)}
        shutil.rmtree(out)
        out.mkdir(parents=True)
        write_state(out, "restarting", id=sid, **keep)
        return "restarting"

    def _run_one(self, sid: str, cls: type, ctx: StageContext) -> dict[str, Any]:
        out = self.out_dir(sid)
        if self.is_done(sid):
            logger.info("%s: cached at %s", self.label(sid), out)
            return self._cached(sid)
        stage = self._build(sid, cls)
        how = self._prepare(sid, stage, out)
        out.mkdir(parents=True, exist_ok=True)
        attempt = int(read_state(out).get("attempt", 0)) + 1
        write_state(out, "running", id=sid, name=self.specs[sid].component.name, key=self.keys[sid],
                    attempt=attempt, started=time.time())
        logger.info("%s: %s in %s", self.label(sid), "running" if how in ("fresh", "restarting") else "resuming",
                    out)
        summary = self._call(sid, stage, out, ctx)
        atomic_write_json(out / "summary.json", summary, indent=2)
        atomic_write_json(out / DONE, {"key": self.keys[sid], "id": sid, "finished": time.time()})
        write_state(out, "done", finished=time.time())
        (out / ERROR_LOG).unlink(missing_ok=True)
        return {**summary, "cached": False, "dir": str(out)}

    def _call(self, sid: str, stage: Stage, out: Path, ctx: StageContext, record: bool = True) -> dict[str, Any]:
        t0 = time.perf_counter()
        threads = _torch_threads()
        try:
            summary = dict(stage.run(out, ctx) or {})
        except StageIncomplete as exc:
            if record:
                write_state(out, "incomplete", reason=describe(exc))
            raise StageFailed(sid, self.specs[sid].component.name, str(out), exc) from exc
        except Exception as exc:
            if record:
                write_state(out, "failed", reason=describe(exc))
                atomic_write(out / ERROR_LOG, "".join(traceback.format_exception(type(exc), exc,
                                                                                 exc.__traceback__)))
            raise StageFailed(sid, self.specs[sid].component.name, str(out), exc) from exc
        finally:  # a training stage may have lowered torch's thread count: later work gets it back
            _torch_threads(threads)
        summary.setdefault("seconds", round(time.perf_counter() - t0, 2))
        summary.update(self.facts.get(sid, {}))
        return summary

    def _run_worker(self, sid: str, cls: type, ctx: StageContext) -> dict[str, Any]:
        """A distributed stage on a rank other than 0: run it alongside rank 0, then wait for its marker."""
        out = self.out_dir(sid)
        if self.is_done(sid):
            return self._cached(sid)
        out.mkdir(parents=True, exist_ok=True)
        summary = self._call(sid, self._build(sid, cls), out, ctx, record=False)
        self._wait_for(sid)
        return {**summary, "cached": False, "dir": str(out)}

    def _wait_for(self, sid: str) -> dict[str, Any]:
        """Ranks other than 0: wait until rank 0 has finished stage ``sid`` (or recorded its failure)."""
        out = self.out_dir(sid)
        logger.info("%s: waiting for rank 0 (%s)", self.label(sid), out)

        started = time.time() - 5.0

        def failed() -> str | None:  # a failure rank 0 records while we wait (not an older one)
            rec = read_state(out)
            if rec.get("state") in ("failed", "incomplete") and rec.get("updated", 0) >= started:
                return rec.get("reason") or rec["state"]
            return None

        wait_for(out / DONE, self.label(sid), failed=failed)
        return self._cached(sid)

    def _closure(self, ids: set[str]) -> set[str]:
        out: set[str] = set()
        todo = list(ids)
        while todo:
            sid = todo.pop()
            if sid in out or sid not in self.specs:
                continue
            out.add(sid)
            todo.extend(_refs(self.specs[sid].component.options))
        return out
