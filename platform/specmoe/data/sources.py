# SPDX-License-Identifier: Apache-2.0
"""Finding and reading benchmark files.

A benchmark file is looked for, in this order: an explicit ``path`` (must exist when set); ``<data_dir>/<relative
path>`` for the dataset's ``data_dir`` option, then the running recipe's (:func:`run_data_dir`), then
``$SPECMOE_DATA_DIR`` (the layout of ``shared/data/``); a file of a hub *dataset* repository (with
``HF_HUB_OFFLINE=1`` only the local hub cache). When nothing is found a ``UserError`` lists every place tried.
"""

from __future__ import annotations

import contextlib
import contextvars
import gzip
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from specmoe.errors import UserError

__all__ = ["DATA_DIR_ENV", "DataRequest", "hub_offline", "locate", "read_records", "run_data_dir"]

#: environment variable naming a data directory laid out like ``shared/data/``
DATA_DIR_ENV = "SPECMOE_DATA_DIR"
#: the running recipe's ``data_dir`` (set by :func:`run_data_dir` for the duration of a run)
_RUN_DATA_DIR: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("specmoe_run_data_dir", default=None)


@contextlib.contextmanager
def run_data_dir(path: Optional[str]):
    """Within this block datasets also look under ``path`` (after their own ``data_dir`` option, before
    ``$SPECMOE_DATA_DIR``), without touching ``os.environ``."""
    token = _RUN_DATA_DIR.set(str(path) if path else None)
    try:
        yield
    finally:
        _RUN_DATA_DIR.reset(token)

_TRUE = {"1", "true", "yes", "on"}


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` (or ``HF_DATASETS_OFFLINE``) asks for no network access."""
    return any(os.environ.get(k, "").strip().lower() in _TRUE
               for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


@dataclass
class DataRequest:
    """Where one benchmark file may live.

    Attributes:
        what: a label for messages, e.g. ``"gsm8k (split 'test')"``.
        relative: path under a data directory, e.g. ``"gsm8k/test.jsonl"``.
        path: explicit file from the recipe; wins over everything else.
        hub_id: hub dataset repository, e.g. ``"openai/gsm8k"``; None = no hub fallback.
        revision: hub revision; None = the default branch.
    """

    what: str
    relative: str
    path: Optional[str] = None
    data_dir: Optional[str] = None
    hub_id: Optional[str] = None
    hub_file: Optional[str] = None
    revision: Optional[str] = None


def _hub_fetch(req: DataRequest, tried: list[str]) -> Optional[Path]:
    where = f"Hugging Face hub dataset '{req.hub_id}', file '{req.hub_file}'"
    offline = hub_offline()
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:  # pragma: no cover - installed with transformers
        tried.append(f"{where}: huggingface_hub is not installed ({exc})")
        return None
    try:
        got = hf_hub_download(repo_id=req.hub_id, filename=req.hub_file, repo_type="dataset",
                              revision=req.revision, local_files_only=offline)
    except Exception as exc:  # noqa: BLE001 - network, missing repo/file, gated repo, offline cache miss
        reason = "not in the local hub cache (HF_HUB_OFFLINE=1)" if offline else \
            f"download failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        tried.append(f"{where}: {reason}")
        return None
    return Path(got)


def locate(req: DataRequest) -> Path:
    """The first existing file for ``req`` (in the module docstring's order); ``UserError`` when none."""
    tried: list[str] = []
    if req.path:
        p = Path(req.path).expanduser()
        if p.is_file():
            return p
        raise UserError(f"{req.what}: the recipe's `path` '{req.path}' does not exist "
                        f"(resolved to {p.resolve()}). Fix the path, or remove `path` to use "
                        f"`data_dir`, ${DATA_DIR_ENV} or the hub.")
    tried.append("recipe `path`: not set")
    roots = (("`data_dir` option", req.data_dir), ("the recipe's `data_dir`", _RUN_DATA_DIR.get()),
             (f"${DATA_DIR_ENV}", os.environ.get(DATA_DIR_ENV)))
    for label, root in roots:
        if not root:
            tried.append(f"{label}: not set")
            continue
        p = Path(root).expanduser() / req.relative
        if p.is_file():
            return p
        tried.append(f"{label}: {p} (missing)")
    if req.hub_id and req.hub_file:
        got = _hub_fetch(req, tried)
        if got is not None:
            return got
    else:
        tried.append("Hugging Face hub: no hub id for this file")
    lines = "\n".join(f"  {i}. {t}" for i, t in enumerate(tried, 1))
    raise UserError(
        f"{req.what}: could not find '{req.relative}'. Tried, in order:\n{lines}\n"
        f"Fix: set `path:` on this dataset in the recipe to the file, or export {DATA_DIR_ENV}=<dir> (or "
        f"set `data_dir:`) for a directory holding '{req.relative}' (the layout of the project's "
        f"shared/data/ folder){_hub_hint(req)}.")


def _hub_hint(req: DataRequest) -> str:
    if not (req.hub_id and req.hub_file):
        return ""
    if hub_offline():
        return ", or unset HF_HUB_OFFLINE to download it from the hub"
    return ", or check network access to huggingface.co (set HF_TOKEN for gated repositories)"


def _jsonl_lines(lines: Iterable[str], where: Path) -> list[dict[str, Any]]:
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{where}: line {n} is not valid JSON ({exc.msg}); expected one JSON object "
                            f"per line") from exc
        if not isinstance(rec, dict):
            raise UserError(f"{where}: line {n} is a {type(rec).__name__}, expected a JSON object")
        out.append(rec)
    return out


def _parquet(path: Path, drop_columns: Iterable[str]) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise UserError(f"{path}: reading a parquet file from the hub needs pyarrow: pip install pyarrow "
                        f"(or provide the JSONL file through `path`/{DATA_DIR_ENV} instead)") from exc
    drop = set(drop_columns)
    cols = [c for c in pq.read_schema(path).names if c not in drop]
    return pq.read_table(path, columns=cols).to_pylist()


def read_records(path: Path, drop_columns: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Every record of a ``.jsonl``, ``.jsonl.gz``/``.gz``, ``.json`` (array of objects, or an object whose only
    list value holds them) or ``.parquet`` file, in file order; ``drop_columns``: parquet columns not to read."""
    name = path.name.lower()
    if name.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return _jsonl_lines(fh, path)
    if name.endswith(".parquet"):
        return _parquet(path, drop_columns)
    if name.endswith(".json"):
        with open(path, encoding="utf-8") as fh:
            try:
                data = json.load(fh)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}: not valid JSON ({exc.msg})") from exc
        if isinstance(data, dict):
            lists = [v for v in data.values() if isinstance(v, list)]
            data = lists[0] if len(lists) == 1 else data
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise UserError(f"{path}: expected a JSON array of objects")
        return data
    with open(path, encoding="utf-8") as fh:
        return _jsonl_lines(fh, path)
