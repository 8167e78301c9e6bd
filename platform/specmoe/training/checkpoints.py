# SPDX-License-Identifier: Apache-2.0
"""Which Lightning checkpoint a training stage resumes from, and whether it still has budget left.

Usage: ``trainer.fit(module, data, ckpt_path=resume_checkpoint(out / "checkpoints"))``; damaged checkpoints
(a killed process, a full disk) are moved aside to ``<name>.damaged``, never deleted.
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from specmoe.training.trainer import TrainerOptions

__all__ = ["resume_checkpoint", "checkpoint_problem", "has_budget_left", "DAMAGED_SUFFIX"]

logger = logging.getLogger(__name__)
DAMAGED_SUFFIX = ".damaged"


def checkpoint_problem(path: str | Path) -> Optional[str]:
    """Why ``path`` is not a readable checkpoint (``None`` when it is whole): a truncated ``torch.save`` zip has
    no zip directory; a corrupted one fails a member's CRC check or unpickling."""
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            return "it is empty"
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
            if bad is not None:
                return f"member {bad} is corrupted"
        _load(path)
    except zipfile.BadZipFile:
        return "it is truncated or not a torch checkpoint (no zip directory at its end)"
    except Exception as exc:  # noqa: BLE001 - any failure to read it back makes it unusable
        return f"it cannot be read back ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    return None


def _load(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(str(path), map_location="cpu", weights_only=False, mmap=True)


def _resumable(path: Path) -> bool:
    """A full training checkpoint (optimizer and loop state), not a weights-only export."""
    state = _load(path)
    return isinstance(state, dict) and "optimizer_states" in state and "state_dict" in state


def _candidates(directory: Path, first: str) -> list[Path]:
    if not directory.is_dir():
        return []
    files = [p for p in directory.glob("*.ckpt") if p.is_file()]
    return sorted(files, key=lambda p: (p.name != first, -p.stat().st_mtime))


def resume_checkpoint(where: str | Path) -> Optional[str]:
    """The newest readable, resumable checkpoint in the directory ``where`` (given a file such as
    ``checkpoints/last.ckpt``: that file first, then the others of its directory, newest first), as a string
    for ``trainer.fit(ckpt_path=...)``; ``None`` when there is none. Damaged checkpoints are renamed
    ``<name>.damaged`` and reported with a warning.
    """
    where = Path(where)
    first = "last.ckpt"
    if where.suffix == ".ckpt":
        where, first = where.parent, where.name
    damaged: list[str] = []
    chosen: Optional[Path] = None
    for cand in _candidates(where, first):
        problem = checkpoint_problem(cand)
        if problem is None:
            if _resumable(cand):
                chosen = cand
                break
            continue  # a weights-only export (e.g. final.ckpt): not something training resumes from
        aside = cand.with_name(cand.name + DAMAGED_SUFFIX)
        cand.replace(aside)
        damaged.append(f"{cand} ({problem}; kept as {aside.name})")
    if damaged:
        then = f"resuming from {chosen}" if chosen is not None else \
            "no valid checkpoint is left, so training starts again from step 0"
        logger.warning("damaged checkpoint%s: %s; %s", "s" if len(damaged) > 1 else "", "; ".join(damaged), then)
    return str(chosen) if chosen is not None else None


def _max_steps(trainer_options: TrainerOptions | dict[str, Any] | None) -> int:
    if trainer_options is None:
        return -1
    value = trainer_options.get("max_steps") if isinstance(trainer_options, dict) else \
        getattr(trainer_options, "max_steps", -1)
    return int(value) if value is not None else -1


def has_budget_left(out_dir: str | Path, trainer_options: TrainerOptions | dict[str, Any] | None = None) -> bool:
    """Whether a failed training stage in ``out_dir`` may resume: True when it keeps no checkpoint (not a training
    stage), False when every checkpoint is damaged, else whether the newest valid one is below
    ``trainer_options.max_steps`` (epoch budgets are not checked)."""
    ckpts = sorted(Path(out_dir).rglob("*.ckpt"), key=lambda p: -p.stat().st_mtime)
    if not ckpts:
        return True
    dirs = list(dict.fromkeys(p.parent for p in ckpts))
    found = None
    for d in dirs:
        found = found or resume_checkpoint(d)
    if found is None:
        return False
    budget = _max_steps(trainer_options)
    if budget <= 0:
        return True
    return int(_load(Path(found)).get("global_step", 0)) < budget
