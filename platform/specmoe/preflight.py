# SPDX-License-Identifier: Apache-2.0
"""Checks that run before any work: resources a recipe needs, checkpoints and data it names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specmoe.config.schema import Component, RunConfig
from specmoe.errors import UserError

__all__ = ["preflight", "PATH_KEYS", "RUN_ARTIFACTS", "tracked_run_artifacts"]

#: option names that hold a checkpoint / file location
PATH_KEYS = ("path", "checkpoint", "model_path")


#: what a run writes into its working directory (git pathspecs): never to be tracked by git
RUN_ARTIFACTS = ("mlflow.db", "mlflow.db-*", "mlflow.db.lock", ":(glob)**/*.lock", "runs", "mlruns", "mlartifacts",
                 ".specmoe_cache", ".specmoe")


def tracked_run_artifacts(workdir: Path | str) -> list[str]:
    """Files under ``workdir`` a run writes (:data:`RUN_ARTIFACTS`) that git tracks there (empty without git)."""
    import subprocess

    try:
        done = subprocess.run(["git", "ls-files", "-z", "--", *RUN_ARTIFACTS], cwd=workdir, capture_output=True,
                              text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted(f for f in done.stdout.split("\0") if f) if done.returncode == 0 else []


def _offline() -> bool:
    return bool(os.environ.get("HF_HUB_OFFLINE")) or bool(os.environ.get("TRANSFORMERS_OFFLINE"))


def _looks_local(value: str) -> bool:
    return value.startswith((".", "/", "~")) or value.count("/") != 1 or Path(value).exists()


def _check_component(comp: Component | None, where: str, problems: list[str]) -> None:
    if comp is None:
        return
    for key in PATH_KEYS:
        value = comp.options.get(key)
        if not isinstance(value, str) or not value or value.startswith("stage:"):
            continue
        if _looks_local(value):
            if not Path(value).expanduser().exists():
                problems.append(f"{where}.{key}: '{value}' does not exist; build it (e.g. with a stage) or fix "
                                f"the path")
        elif _offline():
            problems.append(f"{where}.{key}: '{value}' is a hub id but hub access is off (HF_HUB_OFFLINE); "
                            f"download it and give a local path")


def preflight(cfg: RunConfig, source: str = "recipe") -> dict[str, list[Any]]:
    """Raise :class:`UserError` listing every missing resource; return the loaded dataset samples."""
    problems: list[str] = []
    need, memory = cfg.requires.cuda_devices, cfg.requires.gpu_memory_gb
    if memory and not need:
        problems.append("requires.gpu_memory_gb is set but requires.cuda_devices is 0: say how many GPUs of that "
                        "memory the recipe needs")
    if need:
        try:
            import torch

            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except ImportError:  # pragma: no cover
            have = 0
        if have < need:
            problems.append(f"requires.cuda_devices: this recipe needs {need} CUDA GPU(s); this machine has "
                            f"{have}. Run it on a GPU node (see README: multi-GPU / multi-node).")
        elif memory:
            import torch

            mem = min(torch.cuda.get_device_properties(i).total_memory for i in range(have)) / 2**30
            if mem < memory:
                problems.append(f"requires.gpu_memory_gb: needs {memory} GB per GPU; the smallest here has "
                                f"{mem:.0f} GB")
    tracked = tracked_run_artifacts(Path.cwd())
    if tracked:
        shown = ", ".join(tracked[:5]) + (f" and {len(tracked) - 5} more" if len(tracked) > 5 else "")
        problems.append(f"git tracks files that a run writes ({shown}): every run would rewrite them and dirty "
                        f"the checkout. Untrack them (git rm --cached <file>) and add them to .gitignore")
    if (cfg.methods or cfg.datasets) and cfg.target is None:
        problems.append("target: the recipe evaluates methods but names no target")
    _check_component(cfg.target, "target", problems)
    for i, m in enumerate(cfg.methods):
        for part in ("drafter", "predictor"):
            _check_component(getattr(m, part), f"methods.{i}.{part}", problems)
    for i, st in enumerate(cfg.stages):
        _check_component(st.component, f"stages.{i}", problems)
    samples: dict[str, list[Any]] = {}
    if not problems:
        for i, ds in enumerate(cfg.datasets):
            try:
                samples[ds.name] = ds.build().load()
            except UserError as exc:
                problems.append(f"datasets.{i} ({ds.name}): {exc}")
    if problems:
        raise UserError(f"{source}: cannot start, nothing was run:\n  - " + "\n  - ".join(problems))
    return samples
