# SPDX-License-Identifier: Apache-2.0
"""Exports of a predictor at the first validation reaching each accuracy level (paper Table 9: ~50 %, ~60 %)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from lightning.pytorch.callbacks import Callback

__all__ = ["accuracy_milestones"]


def accuracy_milestones(levels: list[float], out: Path,
                        export: Callable[[Path, Path, dict[str, Any]], Any], monitor: str = "val/acc") -> Callback:
    """A Lightning callback that, at the first validation whose ``monitor`` reaches each level, saves a
    weights-only checkpoint ``out/checkpoints/milestone-accNN.ckpt`` and (on rank 0) calls
    ``export(checkpoint, out / "milestones" / "accNN", {"val_acc": acc, "milestone": level})``. The levels
    reached are kept in ``callback.reached`` and its checkpointed state (a resumed run does not export twice).
    """
    from lightning.pytorch.callbacks import Callback

    class AccuracyMilestones(Callback):
        def __init__(self) -> None:
            self.reached: dict[str, dict[str, Any]] = {}

        def on_validation_end(self, trainer, pl_module) -> None:
            if trainer.sanity_checking or monitor not in trainer.callback_metrics:
                return
            acc = float(trainer.callback_metrics[monitor])
            for level in sorted(levels):
                name = f"acc{round(level * 100):02d}"
                if acc < level or name in self.reached:
                    continue
                ckpt = out / "checkpoints" / f"milestone-{name}.ckpt"
                trainer.save_checkpoint(ckpt, weights_only=True)
                if trainer.is_global_zero:
                    export(ckpt, out / "milestones" / name, {"val_acc": acc, "milestone": level})
                self.reached[name] = {"level": level, "val_acc": acc, "global_step": trainer.global_step}

        def state_dict(self) -> dict[str, Any]:
            return {"reached": self.reached}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.reached = dict(state.get("reached", {}))

    return AccuracyMilestones()
