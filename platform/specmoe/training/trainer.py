# SPDX-License-Identifier: Apache-2.0
"""Recipe keys for ``lightning.Trainer`` shared by every training stage (multi-GPU / multi-node ready).

Multi-node: launch the same command on every node with torchrun (``--nnodes N --node_rank R
--master_addr HOST --master_port PORT --nproc_per_node G``) or under SLURM (``srun``); Lightning reads
``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``, ``WORLD_SIZE`` / the SLURM variables itself. Set
``trainer.devices`` to the GPUs per node and ``trainer.num_nodes`` to N.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

__all__ = ["TrainerOptions", "build_trainer", "mlflow_logger"]


@dataclass
class TrainerOptions:
    """Subset of ``lightning.Trainer`` arguments exposed in recipes (``trainer: {...}``)."""

    accelerator: str = "auto"
    devices: Any = 1
    """devices per node: an int, a list of indices, or ``auto``."""
    num_nodes: int = 1
    strategy: str = "auto"
    """``auto``, ``ddp``, ``fsdp``, ``ddp_spawn``, ``deepspeed_stage_2``..."""
    precision: str = "32-true"
    """``32-true``, ``bf16-mixed``, ``16-mixed``..."""
    accumulate_grad_batches: int = 1
    max_epochs: int = 1
    max_steps: int = -1
    max_time: Optional[str] = None
    """wall-clock cap ``DD:HH:MM:SS``."""
    val_check_interval: Optional[float] = None
    check_val_every_n_epoch: int = 1
    log_every_n_steps: int = 10
    gradient_clip_val: Optional[float] = None
    num_threads: Optional[int] = None
    """torch intra-op threads per process (CPU); default: cores / processes on this node."""
    enable_progress_bar: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    """any other ``lightning.Trainer`` keyword argument."""


def _cores_busy_elsewhere(window: float = 0.3) -> float:
    """Cores kept busy by *other* processes, measured over ``window`` seconds (``/proc``; elsewhere the
    1-minute load average, which also counts this process)."""
    import time

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            cpu = [int(v) for v in f.readline().split()[1:]]
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
        return sum(cpu) - cpu[3] - (cpu[4] if len(cpu) > 4 else 0), int(own[11]) + int(own[12])

    try:
        busy0, own0 = sample()
        t0 = time.monotonic()
        time.sleep(window)
        busy1, own1 = sample()
        ticks = os.sysconf("SC_CLK_TCK") * (time.monotonic() - t0)
        return max(0.0, ((busy1 - busy0) - (own1 - own0)) / ticks)
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def build_trainer(opts: TrainerOptions, out_dir: str | Path, *, callbacks: list[Any] | None = None,
                  logger: Any = None, **overrides: Any):
    """A ``lightning.Trainer`` writing checkpoints and logs under ``out_dir`` (never ``lightning_logs/``)."""
    import lightning as L
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    threads = opts.num_threads
    if threads is None:
        procs = opts.devices if isinstance(opts.devices, int) and opts.devices > 0 else 1
        threads = max(1, (os.cpu_count() or 1) // procs)
        if threads > 1:  # oversubscribed OpenMP threads spin-wait: ~10x slower steps measured on 2 cores
            free = int((os.cpu_count() or 1) - _cores_busy_elsewhere() + 0.5)
            threads = max(1, min(threads, free))
    torch.set_num_threads(threads)
    kwargs: dict[str, Any] = dict(
        accelerator=opts.accelerator, devices=opts.devices, num_nodes=opts.num_nodes, strategy=opts.strategy,
        precision=opts.precision, accumulate_grad_batches=opts.accumulate_grad_batches,
        max_epochs=opts.max_epochs, max_steps=opts.max_steps, max_time=opts.max_time,
        val_check_interval=opts.val_check_interval, check_val_every_n_epoch=opts.check_val_every_n_epoch,
        log_every_n_steps=opts.log_every_n_steps, gradient_clip_val=opts.gradient_clip_val,
        enable_progress_bar=opts.enable_progress_bar, default_root_dir=str(out), callbacks=callbacks or [],
        logger=logger if logger is not None else False, enable_model_summary=False)
    kwargs.update(opts.extra)
    kwargs.update(overrides)
    return L.Trainer(**kwargs)


def mlflow_logger(ctx: Any, run_name: str, params: Optional[dict[str, Any]] = None,
                  tags: Optional[dict[str, str]] = None) -> Any:
    """A Lightning ``MLFlowLogger`` for a training stage, or ``None`` when the run has no tracking.

    Nested under ``ctx.parent_run_id`` (in the parent's experiment) when given, else in the recipe's
    experiment. With a ``sqlite:///`` store the artifact location is ``mlartifacts/`` beside the database
    (MLflow 3 refuses the default ``./mlruns`` store there).
    """
    uri = getattr(ctx, "tracking_uri", None)
    if not uri:
        return None
    from lightning.pytorch.loggers import MLFlowLogger

    uri = str(uri)
    parent = getattr(ctx, "parent_run_id", None)
    all_tags = dict(tags or {})
    if parent:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment(client.get_run(parent).info.experiment_id).name
        all_tags["mlflow.parentRunId"] = parent
    else:
        rc = getattr(ctx, "run_config", None)
        experiment = getattr(getattr(rc, "tracking", None), "experiment", None) or getattr(rc, "name", None) \
            or "specmoe"
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
    logger = MLFlowLogger(experiment_name=experiment, run_name=run_name, tracking_uri=uri, tags=all_tags or None,
                          artifact_location=location)
    if params:
        logger.log_hyperparams(params)
    return logger
