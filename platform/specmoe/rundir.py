# SPDX-License-Identifier: Apache-2.0
"""Run directories: ``<output_dir>/<recipe name>/<YYYYmmdd-HHMMSS>-<id>/`` with the resolved recipe,
overrides, environment and results."""

from __future__ import annotations

import json
import platform as _platform
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["make_run_dir", "environment", "git_sha"]


def git_sha(path: Path | None = None) -> str | None:
    """The commit of the repository holding ``path`` (this package by default), if any."""
    where = path or Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment() -> dict[str, Any]:
    """Versions and hardware, for ``env.json`` and run parameters."""
    import importlib.metadata as md

    versions = {}
    for dist in ("specmoe", "torch", "transformers", "lightning", "torchmetrics", "mlflow", "omegaconf", "triton"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    env: dict[str, Any] = {"python": sys.version.split()[0], "platform": _platform.platform(),
                           "versions": versions, "git_sha": git_sha(), "cpu_count": __import__("os").cpu_count()}
    try:
        import torch

        if torch.cuda.is_available():
            env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:  # pragma: no cover
        pass
    return env


def make_run_dir(output_dir: str | Path, name: str, resolved: dict[str, Any], overrides: list[str]) -> Path:
    """Create the run directory and write ``config.yaml``, ``overrides.txt`` and ``env.json``."""
    import yaml

    stamp = time.strftime("%Y%m%d-%H%M%S")
    run = Path(output_dir) / name / f"{stamp}-{secrets.token_hex(3)}"
    run.mkdir(parents=True, exist_ok=False)
    (run / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    (run / "overrides.txt").write_text("\n".join(overrides) + ("\n" if overrides else ""))
    (run / "env.json").write_text(json.dumps(environment(), indent=2))
    return run
