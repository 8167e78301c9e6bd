# SPDX-License-Identifier: Apache-2.0
"""Library entry points behind the CLI: ``run_recipe(path, overrides)`` runs stages then the evaluation grid,
touching only the run directory, caches and tracking store (no printing; ``os.environ`` left alone)."""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from specmoe.config.load import load_recipe
from specmoe.config.schema import RunConfig
from specmoe.config.validate import to_plain
from specmoe.errors import RunFailure, UserError

if TYPE_CHECKING:
    from specmoe.stages.runner import StageRunner
    from specmoe.tracking.client import NullTracker, RunHandle, Tracker

__all__ = ["run_recipe", "run", "RunResult"]

logger = logging.getLogger(__name__)
ERROR_LOG = "error.log"


@dataclass
class RunResult:
    """What a recipe run produced.

    Attributes:
        run_dir: the run directory (``None`` on ranks other than 0).
        stages: stage id -> summary.
        cells: the evaluation cells (:class:`~specmoe.evaluation.results.CellResult`).
        table: the comparison tables as text.
        tracking_uri / run_id / experiment: where the run was logged (``None`` without tracking).
    """

    run_dir: Path | None
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    cells: list[Any] = field(default_factory=list)
    table: str = ""
    tracking_uri: str | None = None
    run_id: str | None = None
    experiment: str | None = None


def run_recipe(path: str | Path, overrides: Sequence[str] = ()) -> RunResult:
    return run(load_recipe(path, overrides))


def _tracker(cfg: RunConfig) -> Tracker | NullTracker:
    from specmoe.tracking.client import NullTracker, Tracker

    if not cfg.tracking.enabled:
        return NullTracker()
    return Tracker.from_config(cfg.tracking, cfg.name, Path.cwd())


def _data_dir(cfg: RunConfig) -> Path | None:
    import os

    from specmoe.data.sources import DATA_DIR_ENV

    value = cfg.data_dir or os.environ.get(DATA_DIR_ENV)
    return Path(value).expanduser().resolve() if value else None


def _device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:  # pragma: no cover
        return "cpu"


def run(cfg: RunConfig) -> RunResult:
    """Run a validated recipe: tracking and preflight checks first, then the stages and the evaluation grid.

    Raises:
        UserError: bad input found before or during the run (the message says what to fix).
        RunFailure: a stage, an evaluation cell or the run failed; ``log`` is the run directory's ``error.log``.
    """
    from specmoe.data.sources import run_data_dir

    data_dir = _data_dir(cfg)
    with run_data_dir(str(data_dir) if data_dir else None):
        return _run(cfg, data_dir)


def _run(cfg: RunConfig, data_dir: Path | None) -> RunResult:
    from specmoe.interfaces.stage import StageContext
    from specmoe.preflight import preflight
    from specmoe.stages.runner import StageRunner
    from specmoe.utils.dist import dist_info
    from specmoe.utils.files import FileLock
    from specmoe.utils.hashing import stable_hash

    source = cfg.source or "recipe"
    rank = dist_info().rank
    tracker = _tracker(cfg) if rank == 0 else None  # checks the tracking URI: seconds, before any work
    stages = StageRunner(cfg.stages, cfg.cache_dir, source)
    samples = preflight(cfg, source)
    if rank != 0:  # torchrun / SLURM worker: join the distributed stages; rank 0 tracks and evaluates
        ctx = StageContext(run_config=cfg, data_dir=data_dir, device=_device())
        return RunResult(run_dir=None, stages=stages.run(ctx))
    resolved = to_plain(cfg)
    recipe_hash = stable_hash(resolved)
    # one process at a time runs a given resolved recipe (a second one waits, then finds everything cached)
    with FileLock(Path(cfg.cache_dir) / "locks" / f"recipe-{cfg.name}-{recipe_hash}.lock",
                  f"recipe '{cfg.name}' ({source})"):
        from specmoe.rundir import make_run_dir

        run_dir = make_run_dir(cfg.output_dir, cfg.name, resolved, cfg.overrides)
        logger.info("run directory: %s", run_dir)
        try:
            return _tracked(cfg, tracker, stages, samples, run_dir, resolved, recipe_hash, data_dir)
        except (KeyboardInterrupt, UserError):
            raise
        except RunFailure as exc:
            exc.log = str(_write_log(run_dir, exc))
            raise
        except Exception as exc:
            log = _write_log(run_dir, exc)
            if type(exc).__module__.startswith("mlflow"):
                what, hint = f"tracking (MLflow at {getattr(tracker, 'uri', '?')})", (
                    "check the tracking store, or rerun with tracking.enabled=false: finished stages and "
                    "evaluation groups are kept")
            else:
                what, hint = f"run of recipe '{cfg.name}'", (
                    "this looks like a bug in specmoe or in a plugin: finished stages and evaluation groups are "
                    "kept, so a rerun continues; report it with the log")
            raise RunFailure(what, exc, log=str(log), hint=hint) from exc


def _write_log(run_dir: Path, exc: BaseException) -> Path:
    from specmoe.utils.files import atomic_write

    return atomic_write(run_dir / ERROR_LOG, "".join(traceback.format_exception(type(exc), exc,
                                                                                exc.__traceback__)))


def _tracked(cfg: RunConfig, tracker: Tracker | NullTracker, stages: StageRunner, samples: dict, run_dir: Path,
             resolved: dict, recipe_hash: str, data_dir: Path | None) -> RunResult:
    from specmoe.interfaces.stage import StageContext
    from specmoe.tracking.environment import env_params, plugin_params
    from specmoe.tracking.schema import PARENT_KIND, RECIPE_HASH_TAG, flatten_params
    from specmoe.utils.files import atomic_write_json

    stages_hash = ",".join(f"{k}:{v}" for k, v in stages.keys.items())
    result = RunResult(run_dir=run_dir, tracking_uri=getattr(tracker, "uri", None),
                       experiment=getattr(tracker, "experiment_name", None))
    tags = {"specmoe.kind": PARENT_KIND, "specmoe.recipe": cfg.name, RECIPE_HASH_TAG: recipe_hash,
            "specmoe.run_dir": str(run_dir), "specmoe.source": cfg.source}
    if cfg.description:
        tags["mlflow.note.content"] = cfg.description
    # resume a killed / failed run of the same resolved recipe; its nested runs left RUNNING become KILLED
    prev = tracker.find_run({"specmoe.kind": PARENT_KIND, RECIPE_HASH_TAG: recipe_hash}, status=None)
    resume = prev.run_id if prev is not None and prev.status != "FINISHED" else None
    if resume is not None:
        killed = tracker.end_stale_children(resume)
        logger.info("resuming MLflow run %s of an earlier attempt%s", resume,
                    f" ({len(killed)} of its nested runs were left running: marked KILLED)" if killed else "")
    with tracker.run(cfg.name, tags=tags, run_id=resume) as parent:
        result.run_id = getattr(parent, "run_id", None)
        if resume is None:
            components = [cfg.target, *cfg.datasets, *(s.component for s in cfg.stages),
                          *(c for m in cfg.methods for c in (m.drafter, m.selector, m.predictor, m.verifier))]
            parent.log_params({**flatten_params(resolved, "recipe"), **env_params(), **plugin_params(components),
                               "stages.keys": stages_hash, "overrides": " ".join(cfg.overrides)})
            parent.log_dict(resolved, "recipe/config.json")
        atomic_write_json(run_dir / "mlflow.json", {"tracking_uri": result.tracking_uri, "run_id": result.run_id,
                                                     "experiment": result.experiment})
        ctx = StageContext(run_config=cfg, data_dir=data_dir, run_dir=run_dir, tracking_uri=result.tracking_uri,
                           parent_run_id=result.run_id, device=_device())
        result.stages = stages.run(ctx)
        atomic_write_json(run_dir / "stages.json", result.stages, indent=2)
        if cfg.methods or cfg.datasets:
            result.cells, result.table = _evaluate(cfg, stages, samples, run_dir, tracker, parent)
    return result


def _evaluate(cfg: RunConfig, stages: StageRunner, samples: dict, run_dir: Path, tracker: Tracker | NullTracker,
              parent: RunHandle):
    from specmoe.data.render import render_turn
    from specmoe.evaluation.report import build_report_tables, log_cell, log_summary, write_results
    from specmoe.evaluation.runner import Evaluator
    from specmoe.stages.runner import substitute_refs
    from specmoe.tracking.environment import code_version, plugin_params

    resolve = stages.resolve
    resolve_key = lambda node: substitute_refs(node, lambda ref: f"stage-key:{stages.keys[ref]}")  # noqa: E731
    tcomp = cfg.target
    target = tcomp.__class__(tcomp.name, resolve(tcomp.options), tcomp.kind).build()
    if target.tokenizer is None:
        raise UserError(f"target '{tcomp.name}' has no tokenizer: evaluation on text benchmarks needs one "
                        f"(set target.tokenizer or use a checkpoint with a tokenizer)")
    tok = target.tokenizer
    render = lambda sample, turn, answers: render_turn(tok, sample, turn, answers)  # noqa: E731
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    components = [cfg.target, *cfg.datasets,
                  *(c for m in cfg.methods for c in (m.drafter, m.selector, m.predictor, m.verifier))]
    code = {**code_version(components), "distributions": plugin_params(components)}

    def log_group(cells: list) -> None:
        if getattr(tracker, "enabled", False):
            for c in cells:
                log_cell(tracker, parent, c)

    evaluator = Evaluator(cfg, target, resolve, resolve_key, samples, render, decode, Path(cfg.cache_dir),
                          code=code, on_group=log_group)
    cells = evaluator.run()
    tables = build_report_tables(cells)
    out = run_dir / "eval"
    text = write_results(cells, tables, out)
    log_summary(tracker, parent, cells, tables, out)
    return cells, text

