# SPDX-License-Identifier: Apache-2.0
"""Recipe keys for ``lightning.Trainer`` shared by every training stage (multi-GPU / multi-node ready).

Multi-node: launch the same command on every node with torchrun or under SLURM, with ``trainer.devices`` the GPUs
per node and ``trainer.num_nodes`` the node count. Precision and threads are never sampled from the machine's load.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence, Union

if TYPE_CHECKING:
    from lightning.pytorch import Trainer
    from lightning.pytorch.loggers import Logger, MLFlowLogger

    from specmoe.interfaces.stage import StageContext

__all__ = ["TrainerOptions", "OptimizerOptions", "build_trainer", "mlflow_logger", "resolve_precision",
           "cpu_has_native_bf16", "default_num_threads", "stage_trainer_options", "trainer_key_facts"]

log = logging.getLogger(__name__)


@dataclass
class TrainerOptions:
    """Subset of ``lightning.Trainer`` arguments exposed in recipes (``trainer: {...}``).

    A stage's length is its step / epoch budget (``max_steps``, ``max_epochs``), the same on every machine;
    ``max_time`` is only a guard.
    """

    accelerator: str = "auto"
    devices: Any = 1
    """devices per node: an int, a list of indices, or ``auto``."""
    num_nodes: int = 1
    strategy: str = "auto"
    """``auto``, ``ddp``, ``fsdp``, ``ddp_spawn``, ``deepspeed_stage_2``..."""
    precision: str = "auto"
    """``auto`` (``bf16-mixed`` where bf16 is faster, else ``32-true``), or any Lightning value."""
    accumulate_grad_batches: int = 1
    max_epochs: int = 1
    max_steps: int = -1
    max_time: Optional[str] = None
    """opt-in wall-clock guard per run, ``DD:HH:MM:SS``: stopping before the budget saves a checkpoint and fails
    with ``StageIncomplete`` (a rerun continues). Not part of the cache key."""
    val_check_interval: Optional[Union[int, float]] = None
    """an int: every that many training batches; a float in (0, 1]: that fraction of an epoch."""
    check_val_every_n_epoch: Optional[int] = 1
    """null: validate every ``val_check_interval`` steps across epochs."""
    log_every_n_steps: int = 10
    gradient_clip_val: Optional[float] = None
    num_threads: Optional[int] = None
    """torch intra-op threads per process (CPU); default: cores / processes on this node. Not in the cache key."""
    enable_progress_bar: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    """any other ``lightning.Trainer`` keyword argument."""


@dataclass
class OptimizerOptions:
    """The AdamW options every training stage shares (a stage's ``Config`` subclasses this: flat recipe keys)."""

    lr: float = 1e-3
    """peak AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """linear warm-up from 0 to ``lr``, in optimizer steps (0: none)."""

    def optimizer(self) -> dict[str, Any]:
        """``{lr, weight_decay, warmup_steps}``: the modules' keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(OptimizerOptions)}


@functools.lru_cache(maxsize=None)
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matrix products natively: x86-64 AVX512-BF16 or AMX tiles, as torch
    reports them; aarch64: the ``bf16`` feature in ``/proc/cpuinfo``. Without them bf16 autocast is emulated."""
    import torch

    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        fn = getattr(torch.cpu, probe, None)
        try:
            if fn is not None and fn():
                return True
        except (RuntimeError, AttributeError):
            continue
    if os.uname().machine in ("aarch64", "arm64"):
        try:
            with open("/proc/cpuinfo") as fh:
                return any(line.startswith("Features") and "bf16" in line.split() for line in fh)
        except OSError:
            return False
    return False


def resolve_precision(precision: str, accelerator: str = "auto", work: str = "train_moe_lm") -> str:
    """The Lightning precision ``precision`` stands for on this machine (``auto`` resolved, others as given).

    ``auto``: ``bf16-mixed`` on a CUDA GPU that supports bf16; on a CPU with native bf16 the faster of
    ``32-true`` and ``bf16-mixed`` for ``work``, measured once per CPU model and kept in the user cache
    (:func:`specmoe.precision.cpu_decision`); ``32-true`` otherwise.
    """
    if str(precision) != "auto":
        return str(precision)
    import torch

    acc = str(accelerator).lower()
    if acc in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
    if acc == "cpu" or (acc == "auto" and not torch.backends.mps.is_available()):
        if not cpu_has_native_bf16():
            return "32-true"
        from specmoe.precision import cpu_decision

        return cpu_decision(work)
    return "32-true"


def default_num_threads(devices: int | str | Sequence[int] = 1) -> int:
    """torch intra-op threads per training process: the cores this process may use, divided by the processes
    on this node (``LOCAL_WORLD_SIZE`` under torchrun, else ``devices``). Never sampled from the load."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    procs = int(os.environ.get("LOCAL_WORLD_SIZE") or 0)
    if procs <= 0:
        procs = len(devices) if isinstance(devices, (list, tuple)) else devices if isinstance(devices, int) else 1
    return max(1, cores // max(1, procs))


def stage_trainer_options(stage_cls: type, options: Any) -> TrainerOptions:
    """The :class:`TrainerOptions` of a training stage: its ``Config``'s default ``trainer`` updated by the
    (partial) ``trainer`` mapping of ``options``."""
    fields = {f.name: f for f in dataclasses.fields(stage_cls.Config)} if hasattr(stage_cls, "Config") else {}
    spec = fields.get("trainer")
    default: Any = None
    if spec is not None:
        default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
        default = None if default is dataclasses.MISSING else default
    base = dataclasses.asdict(default) if dataclasses.is_dataclass(default) else dict(default or {})
    given = (options or {}).get("trainer") if isinstance(options, dict) else getattr(options, "trainer", None)
    given = dataclasses.asdict(given) if dataclasses.is_dataclass(given) else dict(given or {})
    known = {f.name for f in dataclasses.fields(TrainerOptions)}
    return TrainerOptions(**{k: v for k, v in {**base, **given}.items() if k in known})


def trainer_key_facts(stage_cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """``Stage.key_facts`` of every training stage: the precision its trainer resolves to on this machine
    (``{"precision": "32-true"}``). Use as ``key_facts = classmethod(trainer_key_facts)``."""
    opts = stage_trainer_options(stage_cls, options)
    return {"precision": resolve_precision(opts.precision, opts.accelerator)}


def build_trainer(opts: TrainerOptions, out_dir: str | Path, *, callbacks: list[Any] | None = None,
                  logger: Logger | Iterable[Logger] | bool | None = None, **overrides: Any) -> Trainer:
    """A ``lightning.Trainer`` writing checkpoints and logs under ``out_dir`` (never ``lightning_logs/``), with
    ``precision: auto`` and the thread count resolved and ``max_time`` as a :class:`WallClockGuard`."""
    import lightning as L
    import torch
    from lightning.pytorch.loggers import MLFlowLogger

    from specmoe.training.wall_clock import WallClockGuard

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    threads = opts.num_threads if opts.num_threads else default_num_threads(opts.devices)
    torch.set_num_threads(threads)
    precision = resolve_precision(opts.precision, opts.accelerator)
    vci = opts.val_check_interval  # 50.0 from a YAML float means 50 batches (Lightning wants an int)
    vci = int(vci) if isinstance(vci, float) and vci > 1 and vci.is_integer() else vci
    callbacks = list(callbacks or [])
    if opts.max_time:
        callbacks.append(WallClockGuard(opts.max_time))
    kwargs: dict[str, Any] = dict(
        accelerator=opts.accelerator, devices=opts.devices, num_nodes=opts.num_nodes, strategy=opts.strategy,
        precision=precision, accumulate_grad_batches=opts.accumulate_grad_batches,
        max_epochs=opts.max_epochs, max_steps=opts.max_steps,
        val_check_interval=vci, check_val_every_n_epoch=opts.check_val_every_n_epoch,
        log_every_n_steps=opts.log_every_n_steps, gradient_clip_val=opts.gradient_clip_val,
        enable_progress_bar=opts.enable_progress_bar, default_root_dir=str(out), callbacks=callbacks,
        logger=logger if logger is not None else False, enable_model_summary=False)
    kwargs.update(opts.extra)
    kwargs.update(overrides)
    for lg in (kwargs["logger"] if isinstance(kwargs["logger"], (list, tuple)) else [kwargs["logger"]]):
        if isinstance(lg, MLFlowLogger):
            lg.log_hyperparams({"trainer.precision": precision, "trainer.num_threads": threads})
    log.info("trainer: precision %s (from %r), %d threads", precision, opts.precision, threads)
    return L.Trainer(**kwargs)


def mlflow_logger(ctx: StageContext, run_name: str, params: Optional[dict[str, Any]] = None,
                  tags: Optional[dict[str, str]] = None) -> Optional[MLFlowLogger]:
    """A Lightning ``MLFlowLogger`` for a training stage (nested under ``ctx.parent_run_id`` when given), or
    ``None`` without tracking. A ``sqlite:///`` store keeps artifacts in ``mlartifacts/`` beside the database."""
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
