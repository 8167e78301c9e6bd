# SPDX-License-Identifier: Apache-2.0
"""Fitting a drafter's LightningModule inside a stage directory (resumable, CSV + MLflow metrics)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from lightning.pytorch import LightningModule, Trainer
    from torch.utils.data import DataLoader

    from specmoe.interfaces.stage import StageContext
    from specmoe.training.trainer import TrainerOptions

__all__ = ["fit_module", "train_metrics"]


def fit_module(module: LightningModule, loader: DataLoader, opts: TrainerOptions, out_dir: str | Path,
               ctx: StageContext, run_name: str, save_every: int = 500,
               val_loader: Optional[DataLoader] = None) -> Trainer:
    """Fit with checkpoints in ``out_dir/checkpoints`` (``last.ckpt`` resumes a killed run), CSV metrics in
    ``out_dir/logs/version_<n>/metrics.csv`` and MLflow logging when tracking is on; returns the trainer.

    ``run_name``: the MLflow run name (the stage name); ``save_every``: optimizer steps between checkpoints.
    """
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from specmoe.training.checkpoints import resume_checkpoint
    from specmoe.training.trainer import build_trainer, mlflow_logger

    out = Path(out_dir)
    ckpt_dir = out / "checkpoints"
    ckpt = ModelCheckpoint(dirpath=str(ckpt_dir), filename="step-{step:06d}", save_last=True, save_top_k=1,
                           enable_version_counter=False, every_n_train_steps=max(1, save_every))
    loggers: list[Any] = [CSVLogger(save_dir=str(out), name="logs")]
    mlf = mlflow_logger(ctx, run_name, tags={"specmoe.stage": run_name})
    if mlf is not None:
        loggers.append(mlf)
    trainer = build_trainer(opts, out / "lightning", callbacks=[ckpt], logger=loggers)
    last = ckpt_dir / "last.ckpt"
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=val_loader,
                ckpt_path=resume_checkpoint(last))
    return trainer


def train_metrics(trainer: Trainer, prefix: str = "train/") -> dict[str, float]:
    """The trainer's last logged metrics under ``prefix``, rounded for a stage summary."""
    return {k: round(float(v), 5) for k, v in trainer.callback_metrics.items() if k.startswith(prefix)}
