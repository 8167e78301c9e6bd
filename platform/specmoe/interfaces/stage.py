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
        run_config: the whole resolved recipe (read-only; stages should depend only on their own options,
            since only those are part of the cache key).
        data_dir: benchmark/training data directory (layout of ``../shared/data``), if known.
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
    """A stage writes its result into ``out_dir``; the runner caches it under a hash of its config.

    A stage's config may reference another stage's output as the string ``"stage:<id>"``; the runner runs
    that stage first and substitutes its output directory. A stage must be resumable: when ``out_dir``
    holds partial work from a killed run, continue from it.
    """

    #: bump when the stage's code changes what it produces (part of the cache key)
    version: ClassVar[str] = "1"
    #: True for stages that train with ``lightning.Trainer`` across processes: under ``torchrun``/SLURM
    #: every rank runs them (only rank 0 should write the final export). Other stages run on rank 0 while
    #: the other ranks wait for their result.
    distributed: ClassVar[bool] = False

    @classmethod
    def key_facts(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Facts of this machine that change what the stage computes from ``options`` (e.g. the precision a
        training stage's ``precision: auto`` resolves to); the runner hashes them into the cache key and
        writes them into the summary. Default: none."""
        return {}

    @abstractmethod
    def run(self, out_dir: Path, ctx: StageContext) -> dict[str, Any]:
        """Do the work; return a small JSON-able summary (also stored in ``out_dir/summary.json``)."""
