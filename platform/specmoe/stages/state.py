# SPDX-License-Identifier: Apache-2.0
"""What the stage cache knows of a stage directory ``<cache_dir>/stages/<name>-<key>/``: ``state.json`` (state,
failure reason, who ran it), ``error.log`` (last traceback), ``summary.json``, ``.done`` (written last), size, age
and the lock ``<name>-<key>.lock`` beside it, held while a process computes the stage."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from specmoe.utils.files import FileLock, atomic_write_json

__all__ = ["DONE", "STATE", "ERROR_LOG", "StageEntry", "read_state", "write_state", "stage_lock", "list_stages",
           "find", "remove", "dir_size", "human_size", "human_age"]

DONE = ".done"
STATE = "state.json"
ERROR_LOG = "error.log"


def read_state(out: Path) -> dict[str, Any]:
    """The stage directory's state record (``{}`` when it has none)."""
    try:
        return json.loads((out / STATE).read_text())
    except (OSError, ValueError):
        return {}


def write_state(out: Path, state: str, **fields: Any) -> None:
    """Record ``state`` (and ``fields``) in ``out/state.json``, keeping earlier fields such as the id."""
    record = {**read_state(out), **fields, "state": state, "updated": time.time(), "pid": os.getpid(),
              "host": socket.gethostname()}
    if state != "failed" and state != "incomplete":
        record.pop("reason", None)
    atomic_write_json(out / STATE, record, indent=1)


def stage_lock(out: Path, what: str, on_wait: Optional[Callable[[str], None]] = None) -> FileLock:
    """The lock of the stage directory ``out`` (a file beside it, so removing the directory keeps it)."""
    return FileLock(out.with_name(out.name + ".lock"), what, on_wait)


def dir_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover


def human_age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


@dataclass
class StageEntry:
    """One stage directory of the cache."""

    path: Path
    id: str
    name: str
    key: str
    state: str
    """``done``/``failed``/``incomplete``, ``running`` (locked), ``killed`` (died running), ``partial`` (no record)."""
    reason: str
    size: int
    age_s: float

    @property
    def lock(self) -> FileLock:
        return stage_lock(self.path, f"stage '{self.id}' ({self.name})")


def _entry(path: Path, now: float) -> StageEntry:
    name, _, key = path.name.rpartition("-")
    rec = read_state(path)
    done = path / DONE
    sid = rec.get("id", "")
    if not sid and done.is_file():
        try:
            sid = json.loads(done.read_text()).get("id", "")
        except (OSError, ValueError):
            pass
    if done.is_file():
        state = "done"
    elif stage_lock(path, "").is_held_elsewhere():
        state = "running"
    elif rec.get("state") in ("failed", "incomplete"):
        state = rec["state"]
    elif rec.get("state") == "running":
        state = "killed"
    else:
        state = "partial"
    stamps = [p.stat().st_mtime for p in (done, path / STATE) if p.exists()] or [path.stat().st_mtime]
    return StageEntry(path, sid or "?", name, key, state, rec.get("reason", "") if state in ("failed",
                      "incomplete") else "", dir_size(path), now - max(stamps))


def list_stages(cache_dir: str | Path) -> list[StageEntry]:
    """Every stage directory under ``<cache_dir>/stages``, oldest first."""
    root = Path(cache_dir) / "stages"
    if not root.is_dir():
        return []
    now = time.time()
    entries = [_entry(p, now) for p in root.iterdir() if p.is_dir() and "-" in p.name]
    return sorted(entries, key=lambda e: -e.age_s)


def find(entries: list[StageEntry], token: str) -> list[StageEntry]:
    """Entries whose id, key, directory name or ``name-key`` prefix is ``token``."""
    return [e for e in entries if token in (e.id, e.key, e.path.name) or
            (len(token) >= 6 and (e.key.startswith(token) or e.path.name.startswith(token)))]


def remove(entry: StageEntry) -> Optional[str]:
    """Delete a stage directory unless a process is computing it; returns why not, or ``None``."""
    import shutil

    lock = stage_lock(entry.path, entry.id, on_wait=lambda msg: None)
    try:
        lock.acquire(timeout=0)
    except TimeoutError:
        from specmoe.utils.files import holder_text

        return f"in use by {holder_text(lock.holder())}"
    try:
        shutil.rmtree(entry.path)
    finally:
        lock.release()  # the lock file stays: a process waiting on it must not end up with a second one
    return None
