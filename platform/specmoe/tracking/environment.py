# SPDX-License-Identifier: Apache-2.0
"""The environment a run measured in: package versions, code version, git, hardware, plugin sources.
:func:`code_version` is in every evaluation group's cache key, so timings of different code are never mixed."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from specmoe.config.schema import Component

__all__ = ["env_params", "code_version", "source_hash", "git_info", "plugin_params", "hardware", "PACKAGES"]

logger = logging.getLogger(__name__)

PACKAGES = ("specmoe", "torch", "transformers", "lightning", "torchmetrics", "mlflow", "triton")


def env_params() -> dict[str, str]:
    """Flat ``env.*`` params: ``env.python``, ``env.pkg.<dist>`` (the installed :data:`PACKAGES`), ``env.git.sha`` /
    ``env.git.dirty`` (:func:`git_info`), ``env.code.source`` (:func:`code_version`), ``env.hw.*``: :func:`hardware`."""
    import platform as std_platform
    from importlib import metadata

    out: dict[str, str] = {"env.python": std_platform.python_version()}
    for name in PACKAGES:
        try:
            out[f"env.pkg.{name}"] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    for key, value in git_info().items():
        out[f"env.git.{key.replace('git_', '')}"] = str(value).lower()
    out["env.code.source"] = code_version()["source"]
    out.update(hardware())
    return out


def _git(args: list[str], cwd: Path) -> str | None:
    import subprocess

    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


#: file endings that make up a package's code (compiled caches and data files a run writes are not code)
CODE_SUFFIXES = (".py", ".pyi", ".json", ".yaml", ".yml", ".toml", ".cfg", ".txt", ".c", ".cpp", ".cu", ".h")


def source_hash(root: Path | str) -> str:
    """A hash of the code under ``root`` (a package directory, or one module file): every file with a
    :data:`CODE_SUFFIXES` ending, by relative path and content; ``__pycache__`` and hidden folders are skipped."""
    import hashlib

    root = Path(root)
    if root.is_file():
        return hashlib.sha256(root.read_bytes()).hexdigest()[:16]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part == "__pycache__" or part.startswith(".") for part in rel.parts):
            continue
        if path.is_file() and path.suffix in CODE_SUFFIXES:
            digest.update(rel.as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _package_root(module_name: str) -> Path | None:
    """The directory of ``module_name``'s top-level package (or its file for a lone module), if importable."""
    import importlib
    import sys

    top = module_name.partition(".")[0]
    try:
        mod = sys.modules.get(top) or importlib.import_module(top)
    except Exception:  # noqa: BLE001 - provenance never fails a run
        return None
    file = getattr(mod, "__file__", None)
    if file is None:
        paths = list(getattr(mod, "__path__", []) or [])
        return Path(paths[0]) if paths else None
    path = Path(file).resolve()
    return path.parent if path.name == "__init__.py" else path


def code_version(components: Iterable[Component | None] = ()) -> dict[str, Any]:
    """``{"specmoe": version, "source": hash, "plugins": {package: hash}}``: :func:`source_hash` of ``specmoe`` and
    of the top-level package of every plugin ``components`` name; files outside those packages do not change it."""
    from importlib import metadata

    import specmoe

    try:
        out: dict[str, Any] = {"specmoe": metadata.version("specmoe")}
    except metadata.PackageNotFoundError:
        out = {"specmoe": getattr(specmoe, "__version__", "unknown")}
    out["source"] = source_hash(Path(specmoe.__file__).resolve().parent)
    plugins: dict[str, str] = {}
    for comp in components:
        root = _component_root(comp) if comp is not None else None
        if root is not None and root.name not in plugins:
            plugins[root.name] = source_hash(root)
    if plugins:
        out["plugins"] = dict(sorted(plugins.items()))
    return out


def _component_root(comp: Component) -> Path | None:
    """Where the code of the plugin a component names lives (see :func:`code_version`)."""
    from specmoe.registry import registry_for

    try:
        cls = registry_for(comp.kind).get(comp.name)
    except Exception as exc:  # noqa: BLE001 - a bad name is reported by validation, not here
        logger.debug("no plugin class for %s %s: %s", comp.kind, comp.name, exc)
        return None
    return _package_root(getattr(cls, "__module__", "") or "")


def git_info() -> dict[str, Any]:
    """``{"git_sha", "dirty"}`` of the repository holding specmoe (empty for a wheel); never in a cache key."""
    import specmoe

    src = Path(specmoe.__file__).resolve().parent
    sha = _git(["rev-parse", "HEAD"], src)
    if sha is None:
        return {}
    status = _git(["status", "--porcelain", "--untracked-files=no"], src) or ""
    return {"git_sha": sha.strip(), "dirty": bool(status.strip())}


def plugin_params(components: Iterable[Component | None]) -> dict[str, str]:
    """``plugin.<kind>.<name>`` -> ``"<distribution> <version>"`` (else ``"not from a distribution"``) per component."""
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
