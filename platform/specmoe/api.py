# SPDX-License-Identifier: Apache-2.0
"""Library entry points behind the CLI: ``run_recipe(path, overrides)`` runs stages then the evaluation grid."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from specmoe.config.load import load_recipe
from specmoe.config.schema import RunConfig
from specmoe.config.validate import to_plain

__all__ = ["run_recipe", "run", "RunResult"]

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What a recipe run produced."""

    run_dir: Path
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    cells: list[dict[str, Any]] = field(default_factory=list)
    table: str = ""
    tracking_uri: str | None = None
    run_id: str | None = None


def run_recipe(path: str | Path, overrides: Sequence[str] = ()) -> RunResult:
    """Load and validate the recipe, then :func:`run` it."""
    return run(load_recipe(path, overrides))


def _tracker(cfg: RunConfig) -> Any:
    from specmoe.tracking.tracker import NullTracker, Tracker

    if not cfg.tracking.enabled:
        return NullTracker()
    return Tracker.from_config(cfg.tracking, cfg.name, Path.cwd())


def run(cfg: RunConfig) -> RunResult:
    """Run a validated recipe: preflight checks, stages (cached), evaluation grid (cached per cell)."""
    from specmoe.interfaces.stage import StageContext
    from specmoe.preflight import preflight
    from specmoe.rundir import make_run_dir
    from specmoe.stages.runner import StageRunner, rank_world
    from specmoe.tracking.tracker import env_params, flatten_params

    source = getattr(cfg, "source", "recipe")
    if cfg.data_dir:
        os.environ["SPECMOE_DATA_DIR"] = str(Path(cfg.data_dir).expanduser().resolve())
    stages = StageRunner(cfg.stages, cfg.cache_dir, source)
    samples = preflight(cfg, source)
    data_dir = os.environ.get("SPECMOE_DATA_DIR")
    rank, _ = rank_world()
    if rank != 0:  # torchrun / SLURM worker: join the distributed stages; rank 0 tracks and evaluates
        ctx = StageContext(run_config=cfg, data_dir=Path(data_dir) if data_dir else None, device=_device())
        return RunResult(run_dir=Path(cfg.output_dir), stages=stages.run(ctx))
    resolved = to_plain(cfg)
    run_dir = make_run_dir(cfg.output_dir, cfg.name, resolved, getattr(cfg, "overrides", []))
    logger.info("run directory: %s", run_dir)
    tracker = _tracker(cfg)
    recipe_hash = hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()[:16]
    stages_hash = ",".join(f"{k}:{v}" for k, v in stages.keys.items())
    result = RunResult(run_dir=run_dir, tracking_uri=getattr(tracker, "uri", None))
    tags = {"specmoe.kind": "recipe", "specmoe.recipe": cfg.name, "specmoe.recipe_hash": recipe_hash,
            "specmoe.run_dir": str(run_dir)}
    # a killed run of the same resolved recipe is resumed (its finished cells are kept, none duplicated)
    prev = tracker.find_run({"specmoe.kind": "recipe", "specmoe.recipe_hash": recipe_hash}, status=None)
    resume = prev.run_id if prev is not None and prev.status != "FINISHED" else None
    with tracker.run(cfg.name, tags=tags, run_id=resume) as parent:
        result.run_id = getattr(parent, "run_id", None)
        if resume is None:
            parent.log_params({**flatten_params(resolved, "recipe"), **env_params(), "stages.keys": stages_hash})
            parent.log_dict(resolved, "recipe/config.json")
        (run_dir / "mlflow.json").write_text(json.dumps({"tracking_uri": result.tracking_uri,
                                                         "run_id": result.run_id}))
        ctx = StageContext(run_config=cfg, data_dir=Path(data_dir) if data_dir else None, run_dir=run_dir,
                           tracking_uri=result.tracking_uri, parent_run_id=result.run_id, device=_device())
        result.stages = stages.run(ctx)
        (run_dir / "stages.json").write_text(json.dumps(result.stages, indent=2, default=str))
        if cfg.methods or cfg.datasets:
            result.cells, result.table = _evaluate(cfg, stages, samples, run_dir, tracker, parent)
    if result.table:
        print(result.table)
    print(f"run directory: {run_dir}")
    if result.tracking_uri:
        print(f"MLflow: {result.tracking_uri} (run {result.run_id}); compare with: platform compare "
              f"--experiment {cfg.tracking.experiment or cfg.name}")
    return result


def _device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:  # pragma: no cover
        return "cpu"


def _evaluate(cfg: RunConfig, stages: Any, samples: dict, run_dir: Path, tracker: Any, parent: Any):
    from specmoe.data.render import render_turn
    from specmoe.evaluation.report import cells_table, log_summary
    from specmoe.evaluation.runner import Evaluator
    from specmoe.stages.runner import substitute_refs

    resolve = stages.resolve
    resolve_key = lambda node: substitute_refs(node, lambda ref: f"stage-key:{stages.keys[ref]}")  # noqa: E731
    tcomp = cfg.target
    target = tcomp.__class__(tcomp.name, resolve(tcomp.options), tcomp.kind).build()
    if target.tokenizer is None:
        from specmoe.errors import UserError

        raise UserError(f"target '{tcomp.name}' has no tokenizer: evaluation on text benchmarks needs one "
                        f"(set target.tokenizer or use a checkpoint with a tokenizer)")
    tok = target.tokenizer
    render = lambda sample, turn, answers: render_turn(tok, sample, turn, answers)  # noqa: E731
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    evaluator = Evaluator(cfg, target, resolve, resolve_key, samples, render, decode, Path(cfg.cache_dir),
                          tracker, parent)
    cells = evaluator.run()
    out = run_dir / "eval"
    out.mkdir(exist_ok=True)
    slim = [{k: v for k, v in c.items() if k not in ("steps", "outputs", "per_sample")} for c in cells]
    (out / "results.json").write_text(json.dumps(slim, indent=2, default=str))
    for c in cells:
        spec = c["spec"]
        name = (f"samples_{spec['method']}_{spec['dataset']}_T{spec['temperature']}_g{spec['budget']}"
                f"_bs{spec['batch_size']}")
        with open(out / f"{name}.jsonl", "w") as fh:
            for o in c["outputs"]:
                fh.write(json.dumps({"id": o["id"], "turns": o["turns"]}) + "\n")
    table = cells_table(cells)
    (out / "table.md").write_text(table)
    log_summary(tracker, parent, cells, out)
    return cells, table
