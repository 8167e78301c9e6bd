# SPDX-License-Identifier: Apache-2.0
"""Learning-rate schedules of the training modules, from ``transformers.optimization``."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    import torch

__all__ = ["warmup_schedule"]


def warmup_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: Optional[float] = None,
                    min_lr_ratio: Optional[float] = None) -> dict[str, Any]:
    """A Lightning ``lr_scheduler`` entry stepped at every optimizer step: linear warm-up from 0 to the
    optimizer's ``lr`` over ``warmup_steps``, then a cosine decay to ``min_lr_ratio * lr`` at ``total_steps``
    (``trainer.estimated_stepping_batches``); a constant rate after the warm-up when ``min_lr_ratio`` is None or
    the total is unknown or not past the warm-up."""
    from transformers.optimization import (
        get_constant_schedule_with_warmup,
        get_cosine_with_min_lr_schedule_with_warmup,
    )

    warmup = max(int(warmup_steps), 0)
    known = total_steps is not None and math.isfinite(float(total_steps)) and int(total_steps) > warmup
    if min_lr_ratio is None or not known:
        sched = get_constant_schedule_with_warmup(optimizer, warmup)
    else:
        sched = get_cosine_with_min_lr_schedule_with_warmup(optimizer, warmup, int(total_steps),
                                                            min_lr_rate=float(min_lr_ratio))
    return {"scheduler": sched, "interval": "step"}
