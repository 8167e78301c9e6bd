# SPDX-License-Identifier: Apache-2.0
"""``trainer.max_time`` as an opt-in guard that never passes a shortened stage off as complete.

The guard counts the time of the current run only (unlike Lightning's ``Timer``), so every rerun trains for at
most ``max_time`` more.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from lightning.pytorch.callbacks import Timer

from specmoe.errors import StageIncomplete

if TYPE_CHECKING:
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.utilities.types import STEP_OUTPUT

__all__ = ["WallClockGuard"]


class WallClockGuard(Timer):
    """Stop training after ``duration`` (``DD:HH:MM:SS``) of this run; if that is before the budget, save the
    resume checkpoints (``last.ckpt``) and raise :class:`StageIncomplete`. Under DDP every rank stops at the same
    step (rank 0 decides)."""

    def __init__(self, duration: str) -> None:
        super().__init__(duration=duration, interval="step", verbose=False)
        self.duration_text = str(duration)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Ignore the elapsed time of earlier runs: the guard limits each run."""

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: STEP_OUTPUT, batch: Any,
                           batch_idx: int) -> None:
        stopping = trainer.should_stop
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if stopping or not trainer.should_stop or _budget_reached(trainer, batch_idx):
            return
        saved = []
        for cb in trainer.checkpoint_callbacks:
            if getattr(cb, "save_last", False) and cb.dirpath:
                path = os.path.join(cb.dirpath, cb.CHECKPOINT_NAME_LAST + cb.FILE_EXTENSION)
                trainer.save_checkpoint(path)
                saved.append(path)
        where = f"checkpoint saved to {', '.join(saved)}" if saved else "no resume checkpoint is configured"
        budget = (f"step {trainer.global_step} of {trainer.max_steps}" if trainer.max_steps >= 0 else
                  f"step {trainer.global_step}, epoch {trainer.current_epoch + 1} of {trainer.max_epochs}")
        raise StageIncomplete(
            f"training stopped by the wall-clock guard trainer.max_time={self.duration_text} at {budget}: the "
            f"stage is NOT complete ({where}). Run the same command again to continue from the checkpoint "
            f"(each run trains for at most max_time), or remove trainer.max_time to train to the end")


def _budget_reached(trainer: Trainer, batch_idx: int) -> bool:
    """Whether the batch that just ended was the last one of the step / epoch budget."""
    if trainer.max_steps is not None and trainer.max_steps >= 0 and trainer.global_step >= trainer.max_steps:
        return True
    max_epochs = trainer.max_epochs
    if max_epochs is None or max_epochs < 0:
        return False
    last_batch = batch_idx + 1 >= trainer.num_training_batches
    return last_batch and trainer.current_epoch + 1 >= max_epochs
