# SPDX-License-Identifier: Apache-2.0
"""Run a recipe's stages in dependency order, each cached under a hash of what determines it.

A stage's cache key hashes its registry name, its stage ``version`` and its options, where every
``"stage:<id>"`` reference is replaced by the referenced stage's own key, so editing a stage recomputes it and
everything downstream and nothing else. The output directory is
``<cache_dir>/stages/<name>-<key>/``; a ``.done`` marker is written last, so a killed stage leaves partial
work that the stage resumes on the next run, and a finished stage is never run again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

from specmoe.config.errors import ConfigError, Problem
from specmoe.config.schema import StageSpec

__all__ = ["StageRunner", "substitute_refs", "split_ref", "STAGE_PREFIX", "rank_world"]

logger = logging.getLogger(__name__)
STAGE_PREFIX = "stage:"
DONE = ".done"


def split_ref(text: str) -> tuple[str, str]:
    """``"stage:<id>/<sub/path>"`` -> ``(id, "sub/path")`` (the sub-path may be empty)."""
    sid, _, sub = text[len(STAGE_PREFIX):].partition("/")
    return sid, sub


def substitute_refs(node: Any, repl: Callable[[str], Any]) -> Any:
    """Deep-copy ``node`` replacing every ``"stage:<id>[/<sub/path>]"`` string by ``repl(id)`` (joined with
    the sub-path when ``repl`` returns a string)."""
    if isinstance(node, str) and node.startswith(STAGE_PREFIX):
        sid, sub = split_ref(node)
        value = repl(sid)
        return f"{value}/{sub}" if sub and isinstance(value, str) else value
    if isinstance(node, dict):
        return {k: substitute_refs(v, repl) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [substitute_refs(v, repl) for v in node]
    return node


def rank_world() -> tuple[int, int]:
    """Global rank and world size under torchrun / SLURM (0, 1 otherwise)."""
    env = os.environ
    world = int(env.get("WORLD_SIZE") or env.get("SLURM_NTASKS") or 1)
    rank = int(env.get("RANK") or env.get("SLURM_PROCID") or 0)
    return rank, world


def _refs(node: Any) -> set[str]:
    found: set[str] = set()
    substitute_refs(node, lambda ref: found.add(ref))
    return found


#: options that change how a stage reports progress, not what it computes: left out of the cache key.
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


def _torch_threads(n: int | None = None) -> int:
    """torch's intra-op thread count; sets it to ``n`` first if given."""
    import torch

    if n is not None:
        torch.set_num_threads(n)
    return torch.get_num_threads()


class StageRunner:
    """Resolves, hashes and runs stages.

    Args:
        stages: the recipe's stage specs.
        cache_dir: root of the stage cache.
        source: recipe file (for error messages).
    """

    def __init__(self, stages: list[StageSpec], cache_dir: str | Path, source: str = "") -> None:
        self.specs = {s.id: s for s in stages}
        self.cache_dir = Path(cache_dir)
        self.source = source
        self.order = self._toposort()
        self.keys: dict[str, str] = {}
        self.facts: dict[str, dict[str, Any]] = {}
        for sid in self.order:
            self.keys[sid] = self._key(self.specs[sid])

    def _toposort(self) -> list[str]:
        order: list[str] = []
        state: dict[str, int] = {}

        def visit(sid: str, chain: list[str]) -> None:
            if state.get(sid) == 2:
                return
            if state.get(sid) == 1:
                cyc = " -> ".join(chain + [sid])
                raise ConfigError([Problem(self.source, "stages", f"stages depend on each other in a cycle: {cyc}")])
            state[sid] = 1
            for ref in sorted(_refs(self.specs[sid].component.options)):
                if ref in self.specs:
                    visit(ref, chain + [sid])
            state[sid] = 2
            order.append(sid)

        for sid in self.specs:
            visit(sid, [])
        return order

    def _key(self, spec: StageSpec) -> str:
        cls = spec.component.plugin_class()
        opts = _key_view(substitute_refs(spec.component.options, lambda ref: f"stage-key:{self.keys[ref]}"))
        facts = self.facts[spec.id] = cls.key_facts(spec.component.options)
        blob = json.dumps({"name": spec.component.name, "version": getattr(cls, "version", "1"), "options": opts,
                           **({"facts": facts} if facts else {})}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def out_dir(self, sid: str) -> Path:
        return self.cache_dir / "stages" / f"{self.specs[sid].component.name}-{self.keys[sid]}"

    def is_done(self, sid: str) -> bool:
        return (self.out_dir(sid) / DONE).is_file()

    def outputs(self) -> dict[str, Path]:
        return {sid: self.out_dir(sid) for sid in self.order}

    def resolve(self, node: Any) -> Any:
        """Replace ``stage:<id>`` references in ``node`` by output directories."""
        return substitute_refs(node, lambda ref: str(self.out_dir(ref)))

    def run(self, ctx: Any, only: set[str] | None = None) -> dict[str, dict[str, Any]]:
        """Run every stage (or ``only`` those and their dependencies) that is not cached yet.

        Returns:
            stage id -> summary (with ``cached: True`` for stages that were already done).
        """
        needed = set(self.order) if only is None else self._closure(only)
        summaries: dict[str, dict[str, Any]] = {}
        for sid in self.order:
            if sid not in needed:
                continue
            spec = self.specs[sid]
            out = self.out_dir(sid)
            if self.is_done(sid):
                summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
                summaries[sid] = {**summary, "cached": True, "dir": str(out)}
                logger.info("stage %s (%s): cached at %s", sid, spec.component.name, out)
                continue
            cls = spec.component.plugin_class()
            rank, world = rank_world()
            if world > 1 and rank != 0 and not getattr(cls, "distributed", False):
                summaries[sid] = self._wait_for(sid)
                continue
            out.mkdir(parents=True, exist_ok=True)
            resumed = any(p.name != "summary.json" for p in out.iterdir())
            logger.info("stage %s (%s): %s in %s", sid, spec.component.name, "resuming" if resumed else "running",
                        out)
            stage = cls(cls.Config(**self.resolve(spec.component.options)))
            t0 = time.perf_counter()
            threads = _torch_threads()
            try:
                summary = dict(stage.run(out, ctx) or {})
            finally:  # a training stage may have lowered torch's thread count: later work gets it back
                _torch_threads(threads)
            summary.setdefault("seconds", round(time.perf_counter() - t0, 2))
            summary.update(self.facts[sid])
            if rank != 0:  # distributed stage: rank 0 writes the result
                summaries[sid] = {**summary, "cached": False, "dir": str(out)}
                self._wait_for(sid)
                continue
            (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
            (out / DONE).write_text(json.dumps({"key": self.keys[sid], "id": sid, "finished": time.time()}))
            summaries[sid] = {**summary, "cached": False, "dir": str(out)}
        return summaries

    def _wait_for(self, sid: str, poll: float = 2.0) -> dict[str, Any]:
        """Non-zero ranks: wait until rank 0 has finished stage ``sid``."""
        out = self.out_dir(sid)
        logger.info("stage %s: waiting for rank 0 (%s)", sid, out)
        while not (out / DONE).is_file():
            time.sleep(poll)
        summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
        return {**summary, "cached": True, "dir": str(out)}

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
