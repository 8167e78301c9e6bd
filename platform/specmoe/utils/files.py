# SPDX-License-Identifier: Apache-2.0
"""Atomic file writes and inter-process file locks.

Writes go through a temporary file beside the target and ``os.replace``: no reader sees half a file, even after a
kill. :class:`FileLock` is ``filelock``'s native OS lock (``flock`` on POSIX, never its soft fallback): the holder
records who it is for waiters, and the kernel drops the lock with a dying holder, so no lock goes stale."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import filelock

__all__ = ["atomic_write", "atomic_write_json", "atomic_path", "FileLock", "LockTimeout", "holder_text"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (for writers that want a path, e.g. ``safetensors.save_file``); it
    becomes ``path`` (``os.replace``) when the block ends without error, else it is removed. Creates the parent."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` (text or bytes) to ``path`` atomically; creates the parent directory."""
    with atomic_path(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
    return Path(path)


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: Optional[int] = None) -> Path:
    """:func:`atomic_write` of ``obj`` as JSON (values JSON cannot hold are written with ``str``)."""
    return atomic_write(path, json.dumps(obj, indent=indent, default=str))


class LockTimeout(TimeoutError):
    """A lock was not acquired within the time given."""


def holder_text(info: dict[str, Any]) -> str:
    """``pid 123 on host since 12:03:04 (platform run x.yaml)`` from a lock file's holder record."""
    if not info:
        return "another process"
    since = time.strftime("%H:%M:%S", time.localtime(info.get("since", 0)))
    cmd = f" ({info['command']})" if info.get("command") else ""
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')} since {since}{cmd}"


class FileLock:
    """Exclusive inter-process lock (and context manager) on the file ``path``, created if missing. ``what`` labels
    messages (``"stage 'target' (pretrain_target)"``); ``on_wait`` gets one message when we start waiting for another
    holder (default: ``logger.warning``)."""

    def __init__(self, path: str | os.PathLike, what: str = "", on_wait: Optional[Callable[[str], None]] = None):
        self.path = Path(path)
        self.what = what or str(self.path)
        self.on_wait = on_wait or logger.warning
        self._lock = self._native(self._write_holder)

    def _native(self, on_acquired: Optional[Callable[[int], None]] = None) -> filelock.BaseFileLock:
        # the lock file stays (its holder record is read by whoever waits), one lock per object, not per thread
        return filelock.FileLock(self.path, thread_local=False, preserve_lock_file=True, on_acquired=on_acquired)

    @staticmethod
    def _write_holder(fd: int) -> None:
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                  "command": " ".join(Path(sys.argv[0]).name.split() + sys.argv[1:])[:300]}
        data = json.dumps(record).encode()
        os.pwrite(fd, data, 0)  # overwrite first, then cut: the record is never an empty file
        os.ftruncate(fd, len(data))

    def holder(self, settle: float = 0.0) -> dict[str, Any]:
        """Who holds (or last held) the lock (``{}``: unknown); ``settle``: seconds to wait for its record to appear."""
        deadline = time.monotonic() + settle
        while True:
            try:
                info = json.loads(self.path.read_text() or "{}")
            except (OSError, ValueError):
                info = {}
            if info.get("pid") or time.monotonic() >= deadline:
                return info
            time.sleep(0.02)

    def acquire(self, timeout: Optional[float] = None, poll: float = 0.5) -> "FileLock":
        """Take the lock, waiting at most ``timeout`` seconds (``None``: forever), else raise :class:`LockTimeout`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=0)
        except filelock.Timeout:
            self.on_wait(f"{self.what} is in use by {holder_text(self.holder(settle=1.0))}; waiting for it "
                         f"(lock file {self.path})")
            try:
                self._lock.acquire(timeout=-1 if timeout is None else timeout, poll_interval=poll)
            except filelock.Timeout:
                raise LockTimeout(f"{self.what} is in use by {holder_text(self.holder())} (lock file "
                                  f"{self.path}); gave up after {timeout:.0f} s") from None
        return self

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release()

    def is_held_elsewhere(self) -> bool:
        """True when another process holds the lock right now (this call does not keep it)."""
        if self._lock.is_locked or not self.path.exists():
            return False
        probe = self._native()
        try:
            probe.acquire(timeout=0)
        except filelock.Timeout:
            return True
        probe.release()
        return False

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
