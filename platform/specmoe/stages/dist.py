# SPDX-License-Identifier: Apache-2.0
"""The process's place in a multi-process launch (torchrun or SLURM), for stages that split work by rank."""

from __future__ import annotations

import os

__all__ = ["dist_env"]


def dist_env() -> tuple[int, int, int]:
    """``(rank, world, local_rank)`` from torchrun (``RANK``...) or SLURM (``SLURM_PROCID``...) variables."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0))
    return 0, 1, 0
