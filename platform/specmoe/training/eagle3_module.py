# SPDX-License-Identifier: Apache-2.0
"""LightningModule training an EAGLE-3 draft with training-time test against a frozen target, online.

The target is not a submodule (it is never optimized, wrapped by DDP or written into checkpoints): every
rank builds or receives its own copy and runs it under ``no_grad`` to get the three captured hidden states and
the logits of each batch (no feature dumps). The draft is unrolled ``ttt_length`` steps
(:func:`~specmoe.drafting.eagle3_ttt.ttt_unroll`) and trained on the ``0.8**j``-decayed distillation loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Optional

import lightning as L
import torch

from specmoe.drafting.eagle3_model import Eagle3Model
from specmoe.drafting.eagle3_ttt import ttt_loss, ttt_unroll

__all__ = ["Eagle3Module", "fit_module", "teacher_forward", "warmup_cosine"]


@torch.no_grad()
def teacher_forward(target: Any, input_ids: torch.Tensor, valid: torch.Tensor, layers: list[int],
                    out_device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen target on a right-padded batch.

    Args:
        target: an ``hf`` target (``target.model`` a causal LM).
        input_ids, valid: ``[B, L]``.
        layers: ``hidden_states`` indices to concatenate (0 = embeddings).

    Returns:
        ``(features [B, L, len(layers) * H], logits [B, L, V] float32)`` on ``out_device``.
    """
    dev = target.device
    with torch.autocast(device_type=dev.type, enabled=False):
        out = target.model(input_ids=input_ids.to(dev), attention_mask=valid.to(dev).long(),
                           output_hidden_states=True, use_cache=False)
    hs = out.hidden_states
    feats = torch.cat([hs[i] for i in layers], dim=-1)
    return feats.to(out_device), out.logits.float().to(out_device)


def warmup_cosine(warmup: int, total: int, min_ratio: float) -> Callable[[int], float]:
    """LR factor: linear warm-up over ``warmup`` steps, then cosine decay to ``min_ratio`` at ``total``."""

    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if total <= warmup:
            return 1.0
        t = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))

    return f


class Eagle3Module(L.LightningModule):
    """Trains ``draft`` (an :class:`Eagle3Model`) on batches ``{input_ids, valid, loss_mask}``.

    Args:
        draft: the draft to train (its ``embed_tokens`` stays frozen).
        feature_layers: target ``hidden_states`` indices feeding ``fc``.
        target_factory: builds the frozen target on a device (called on ranks that were given none).
        ttt_length: TTT unroll steps (SpecForge default 7).
        decay: per-step loss weight base (0.8).
        lr, betas, weight_decay, warmup_steps, min_lr_ratio: AdamW with warm-up + cosine decay.
    """

    def __init__(self, draft: Eagle3Model, feature_layers: list[int],
                 target_factory: Optional[Callable[[torch.device], Any]] = None, *, ttt_length: int = 7,
                 decay: float = 0.8, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.95),
                 weight_decay: float = 0.0, warmup_steps: int = 0, min_lr_ratio: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["draft", "reference", "target_factory"])
        self.draft = draft.train().requires_grad_(True)
        self.draft.embed_tokens.weight.requires_grad_(False)
        self.feature_layers = list(feature_layers)
        self._target_factory = target_factory
        object.__setattr__(self, "_target", None)  # not a submodule

    # ------------------------------------------------------------------ the frozen target
    def attach_target(self, target: Any) -> None:
        """Use an already loaded target on this rank (it is moved to the module's device at fit start)."""
        object.__setattr__(self, "_target", target)

    @property
    def target(self) -> Any:
        return self._target

    def on_fit_start(self) -> None:
        if self._target is None:
            if self._target_factory is None:
                raise RuntimeError("Eagle3Module: no target attached and no target_factory given")
            object.__setattr__(self, "_target", self._target_factory(self.device))
        tgt = self._target
        if getattr(tgt.config, "device_map", None) is None and tgt.device != self.device:
            tgt.model.to(self.device)
        self.draft.embed_tokens.weight.requires_grad_(False)

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # the frozen embedding is the target's own ([V, H], 2.3 GB in fp32 for GPT-OSS): not checkpointed
        checkpoint["state_dict"].pop("draft.embed_tokens.weight", None)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["state_dict"].setdefault("draft.embed_tokens.weight",
                                            self.draft.embed_tokens.weight.detach().clone())

    # ------------------------------------------------------------------ training
    def token_loss(self, batch: dict[str, torch.Tensor], steps: Optional[int] = None):
        """Teacher pass + TTT unroll + loss; returns ``(loss, logs, out, feats, tlogits)``."""
        ids, valid, loss_mask = batch["input_ids"], batch["valid"], batch["loss_mask"]
        feats, tlogits = teacher_forward(self._target, ids, valid, self.feature_layers, ids.device)
        out = ttt_unroll(self.draft, ids, feats.to(self.draft.fc.weight.dtype), valid,
                         steps or self.hparams.ttt_length)
        loss, losses, accs, _ = ttt_loss(out, tlogits, loss_mask, valid, self.draft.t2d, self.hparams.decay,
                                         self.hparams.ttt_length)
        logs = {"loss_token": loss.detach()}
        for j, (lj, aj) in enumerate(zip(losses, accs)):
            logs[f"loss_{j}"] = lj.detach()
            logs[f"acc_{j}"] = aj
        return loss, logs, out, feats, tlogits

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, logs, *_ = self.token_loss(batch)
        self._log(logs, loss, batch)
        return loss

    def _log(self, logs: dict[str, torch.Tensor], loss: torch.Tensor, batch: dict[str, torch.Tensor]) -> None:
        bs = int(batch["input_ids"].shape[0])
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=bs, sync_dist=True)
        self.log_dict({f"train/{k}": v for k, v in logs.items()}, batch_size=bs, sync_dist=True)

    def configure_optimizers(self):
        hp = self.hparams
        params = [p for p in self.draft.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=hp.lr, betas=tuple(hp.betas), weight_decay=hp.weight_decay)
        total = int(self.trainer.estimated_stepping_batches) if self.trainer is not None else 0
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(hp.warmup_steps, total, hp.min_lr_ratio))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def fit_module(module: L.LightningModule, loader: Any, opts: Any, out_dir: Any, ctx: Any, run_name: str,
               save_every: int = 500) -> L.Trainer:
    """Fit with checkpoints in ``out_dir/checkpoints`` (``last.ckpt`` resumes a killed run), CSV metrics in
    ``out_dir/logs/version_<n>/metrics.csv`` and MLflow logging when tracking is on.

    Args:
        opts: :class:`~specmoe.training.trainer.TrainerOptions`.
        save_every: optimizer steps between checkpoints.
    """
    from pathlib import Path

    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from specmoe.training.checkpoints import resume_checkpoint
    from specmoe.training.trainer import build_trainer, mlflow_logger

    out = Path(out_dir)
    ckpt_dir = out / "checkpoints"
    ckpt = ModelCheckpoint(dirpath=str(ckpt_dir), filename="step-{step:06d}", save_last=True, save_top_k=1,
                           every_n_train_steps=max(1, save_every))
    loggers: list[Any] = [CSVLogger(save_dir=str(out), name="logs")]  # version_<n>/ per (resumed) run
    mlf = mlflow_logger(ctx, run_name)
    if mlf is not None:
        loggers.append(mlf)
    trainer = build_trainer(opts, out / "lightning", callbacks=[ckpt], logger=loggers)
    last = ckpt_dir / "last.ckpt"
    trainer.fit(module, train_dataloaders=loader, ckpt_path=resume_checkpoint(last))
    return trainer
