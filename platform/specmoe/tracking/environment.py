# SPDX-License-Identifier: Apache-2.0
"""The environment a run measured in: package versions, the code version (git), hardware, plugin sources.

:func:`code_version` is part of every evaluation group's cache key, so timings of different code are never
mixed; :func:`env_params` and :func:`plugin_params` are logged as MLflow params of every recipe run.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterable

__all__ = ["env_params", "code_version", "plugin_params", "hardware", "PACKAGES"]

logger = logging.getLogger(__name__)

PACKAGES = ("specmoe", "torch", "transformers", "lightning", "torchmetrics", "mlflow", "triton")


def env_params() -> dict[str, str]:
    """Versions, code version and hardware, as flat ``env.*`` params.

    * ``env.pkg.<dist>``: specmoe, torch, transformers, lightning, torchmetrics, mlflow, triton (when
      installed); the plugins a recipe uses are recorded by :func:`plugin_params`;
    * ``env.git.sha`` / ``env.git.dirty`` / ``env.git.diff``: of the repository holding the specmoe sources,
      if any (:func:`code_version`);
    * ``env.hw.*``: CPU model and cores, GPU names and memory (only when torch is importable and CUDA is
      available), python version.
    """
    import platform as std_platform
    from importlib import metadata

    out: dict[str, str] = {"env.python": std_platform.python_version()}
    for name in PACKAGES:
        try:
            out[f"env.pkg.{name}"] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    code = code_version()
    for key in ("git_sha", "dirty", "diff"):
        if key in code:
            out[f"env.git.{key.replace('git_', '')}"] = str(code[key]).lower()
    out.update(hardware())
    return out


def _git(args: list[str], cwd: Path) -> str | None:
    import subprocess

    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def code_version() -> dict[str, Any]:
    """The code that runs: ``{"specmoe": version, "git_sha", "dirty", "diff"}``.

    ``git_sha`` / ``dirty`` come from the git repository holding the specmoe sources (absent for an
    installed wheel); ``diff`` is a hash of the uncommitted changes to tracked files, so two different dirty
    trees of one commit are told apart.
    """
    from importlib import metadata

    import specmoe
    from specmoe.utils.hashing import stable_hash

    try:
        out: dict[str, Any] = {"specmoe": metadata.version("specmoe")}
    except metadata.PackageNotFoundError:
        out = {"specmoe": getattr(specmoe, "__version__", "unknown")}
    src = Path(specmoe.__file__).resolve().parent
    sha = _git(["rev-parse", "HEAD"], src)
    if sha is None:
        return out
    out["git_sha"] = sha.strip()
    root = Path((_git(["rev-parse", "--show-toplevel"], src) or str(src)).strip())
    diff = _git(["diff", "HEAD", "--no-ext-diff", "--binary"], root) or ""
    untracked = [f for f in (_git(["ls-files", "--others", "--exclude-standard", "-z"], root) or "").split("\0") if f]
    out["dirty"] = bool(diff.strip() or untracked)
    if out["dirty"]:
        out["diff"] = stable_hash([diff, [[f, _small_file_hash(root / f)] for f in sorted(untracked)]], 12)
    return out


def _small_file_hash(path: Path, limit: int = 1 << 20) -> str:
    """A hash of a file's bytes (of its size only when larger than ``limit``)."""
    import hashlib

    try:
        size = path.stat().st_size
        return hashlib.sha256(path.read_bytes()).hexdigest()[:12] if size <= limit else f"size:{size}"
    except OSError:
        return "unreadable"


def plugin_params(components: Iterable[Any]) -> dict[str, str]:
    """``plugin.<kind>.<name>`` -> ``"<distribution> <version>"`` (or where it came from) for every
    :class:`~specmoe.config.schema.Component` used by a recipe."""
    from specmoe.registry import registry_for

    out: dict[str, str] = {}
    for comp in components:
        if comp is None:
            continue
        try:
            dist = registry_for(comp.kind).distribution(comp.name)
        except Exception as exc:  # noqa: BLE001 - never fail a run over provenance
            logger.debug("no distribution for %s %s: %s", comp.kind, comp.name, exc)
            dist = None
        out[f"plugin.{comp.kind}.{comp.name}"] = f"{dist[0]} {dist[1]}" if dist else "not from a distribution"
    return out


def hardware() -> dict[str, str]:
    """``env.hw.*``: CPU model and count, GPUs (names, memory, CUDA version)."""
    import platform as std_platform

    cpu = std_platform.processor() or std_platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    out = {"env.hw.cpu": cpu, "env.hw.cpu_count": str(os.cpu_count() or 0)}
    try:
        import torch
    except ImportError:
        return out
    if torch.cuda.is_available():
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        out["env.hw.gpu_count"] = str(len(props))
        out["env.hw.gpus"] = ", ".join(p.name for p in props)
        out["env.hw.gpu_memory_gb"] = ", ".join(f"{p.total_memory / 2**30:.1f}" for p in props)
        out["env.hw.cuda"] = str(torch.version.cuda)
    else:
        out["env.hw.gpu_count"] = "0"
    return out
