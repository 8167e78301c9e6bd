# SPDX-License-Identifier: Apache-2.0
"""Which process this is (global rank, world size, local rank, node rank) and waiting for rank 0.

Ranks come from the first of Lightning's cluster environments that detects the launch (torchrun, SLURM, LSF,
Kubeflow), so ``platform run`` and its Lightning trainers agree; else from ``RANK`` / ``WORLD_SIZE`` /
``LOCAL_RANK``. A plain ``python`` process is rank 0 of 1 (Lightning is not imported then)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

__all__ = ["DistInfo", "dist_info", "rank_world", "wait_for", "WaitTimeout", "RankFailed", "WAIT_TIMEOUT_ENV"]

#: environment variable: seconds a rank waits for another rank's result before giving up
WAIT_TIMEOUT_ENV = "SPECMOE_WAIT_TIMEOUT_S"
_DEFAULT_WAIT_S = 12 * 3600.0
#: variables any multi-process launcher sets; without one of them this is a single process
_LAUNCH_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_PROCID",
                "LSB_JOBID", "KUBERNETES_PORT", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


@dataclass(frozen=True)
class DistInfo:
    """Ranks of this process: ``rank`` in ``[0, world)``, ``local_rank`` on its node, ``node_rank``."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    node_rank: int = 0
    launcher: str = "none"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _from_lightning() -> Optional[DistInfo]:
    from lightning.fabric.plugins import environments as envs

    for cls in (envs.TorchElasticEnvironment, envs.SLURMEnvironment, envs.LSFEnvironment,
                envs.KubeflowEnvironment):
        try:
            if not cls.detect():
                continue
            env = cls()
            return DistInfo(env.global_rank(), env.world_size(), env.local_rank(), env.node_rank(),
                            cls.__name__.replace("Environment", "").lower())
        except (KeyError, ValueError, RuntimeError, OSError):  # detected but incompletely configured
            continue
    return None


def dist_info() -> DistInfo:
    """The ranks of this process (see the module docstring)."""
    env = os.environ
    if not any(v in env for v in _LAUNCH_VARS):
        return DistInfo()
    found = _from_lightning()
    if found is not None:
        return found
    if "WORLD_SIZE" in env or "RANK" in env:  # launched by hand
        return DistInfo(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)),
                        int(env.get("NODE_RANK", env.get("GROUP_RANK", 0))), "env")
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:  # a SLURM step Lightning refuses (it will say why)
        return DistInfo(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)),
                        int(env.get("SLURM_NODEID", 0)), "slurm-env")
    return DistInfo()


def rank_world() -> tuple[int, int]:
    info = dist_info()
    return info.rank, info.world


class WaitTimeout(TimeoutError):
    """What a rank waited for did not appear in time."""


class RankFailed(RuntimeError):
    """The rank producing what we wait for recorded a failure."""


def _timeout() -> float:
    try:
        return float(os.environ.get(WAIT_TIMEOUT_ENV, _DEFAULT_WAIT_S))
    except ValueError:
        return _DEFAULT_WAIT_S


def wait_for(path: str | os.PathLike, what: str, *, failed: Optional[Callable[[], Optional[str]]] = None,
             timeout: Optional[float] = None, poll: float = 2.0) -> None:
    """Block until ``path`` (the file the other rank writes last, e.g. a ``.done`` marker; ``what`` in messages)
    exists. Raises :class:`RankFailed` once ``failed()`` returns the other rank's failure message, and
    :class:`WaitTimeout` after ``timeout`` seconds (default ``$SPECMOE_WAIT_TIMEOUT_S`` or 12 hours)."""
    limit = _timeout() if timeout is None else timeout
    path = Path(path)
    t0 = time.monotonic()
    while not path.exists():
        reason = failed() if failed is not None else None
        if reason:
            raise RankFailed(f"{what}: the rank producing it failed: {reason}")
        if time.monotonic() - t0 > limit:
            raise WaitTimeout(f"waited {limit:.0f} s for {what} ({path}) and it never came; the rank producing "
                              f"it may have died (raise ${WAIT_TIMEOUT_ENV} if it is only slow)")
        time.sleep(poll)
