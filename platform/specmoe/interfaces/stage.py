# SPDX-License-Identifier: Apache-2.0
"""Stage interface: a cached unit of work (train a target, collect traces, train a drafter...)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional

from specmoe.interfaces.plugin import Plugin

__all__ = ["Stage", "StageContext"]


@dataclass
class StageContext:
    """What a running stage may use besides its own config.

    Attributes:
        run_config: the whole resolved recipe (read-only; only the stage's own options are in its cache key).
        data_dir: benchmark/training data directory, if known.
        run_dir: the current run directory (logs, not cached results).
        tracking_uri: MLflow tracking URI when tracking is enabled, else ``None``.
        parent_run_id: MLflow run id of the recipe run (stages log nested runs under it), if any.
        device: default device for stages that do not choose one.
    """

    run_config: Any = None
    data_dir: Optional[Path] = None
    run_dir: Optional[Path] = None
    tracking_uri: Optional[str] = None
    parent_run_id: Optional[str] = None
    device: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)


class Stage(Plugin, ABC):
    """A stage writes its result into ``out_dir``, cached under a hash of its config; ``"stage:<id>"`` in a config
    becomes that stage's output directory. It must resume from partial work a killed run left in ``out_dir``."""

    #: bump when the stage's code changes what it produces (part of the cache key)
    version: ClassVar[str] = "1"
    #: True: every rank runs it under ``torchrun``/SLURM (only rank 0 writes the export); else rank 0 only
    distributed: ClassVar[bool] = False

    @classmethod
    def key_facts(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Machine facts that change the result but are not in the (validated, resolved) ``options``, e.g. what
        ``precision: auto`` resolves to: part of the cache key. Default: none."""
        return {}

    def can_resume(self, out_dir: Path) -> Optional[bool]:
        """After a failure: ``True`` resume in ``out_dir``, ``False`` start over, ``None`` (default): runner decides."""
        return None

    @abstractmethod
    def run(self, out_dir: Path, ctx: StageContext) -> dict[str, Any]:
        """Do the work; return a small JSON-able summary (also stored in ``out_dir/summary.json``). Raise
        :class:`specmoe.errors.StageIncomplete` when stopping before the budget's end (a rerun continues)."""
