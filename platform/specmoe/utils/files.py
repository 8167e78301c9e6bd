# SPDX-License-Identifier: Apache-2.0
"""Atomic file writes and inter-process file locks.

* :func:`atomic_write` writes through a temporary file in the same directory and an ``os.replace``, so a
  reader (or a process killed mid-write) never sees half a file; :func:`atomic_path` does the same for
  writers that want a path (``safetensors.save_file``).
* :class:`FileLock` is an exclusive OS lock on ``<path>`` (the ``filelock`` library's native lock: ``flock`` on
  POSIX, never its soft fallback); the holder writes who it is into the lock file, so a process that has to wait
  can say who it waits for. The lock is released when the holder exits, however it dies (the kernel drops the
  lock with the process), so a killed run never leaves a stale lock behind.
"""

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
    """Yield a temporary path beside ``path``; when the block ends without error it becomes ``path``
    (``os.replace``), otherwise it is removed. Creates the parent directory.

    Example::

        with atomic_path(out / "model.safetensors") as tmp:
            save_file(state, str(tmp))
    """
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
    """An exclusive inter-process lock on the file ``path`` (created if missing).

    Args:
        path: the lock file.
        what: a label for messages (``"stage 'target' (pretrain_target)"``).
        on_wait: called once with a message when the lock is held by someone else and we start waiting
            (default: ``logger.warning``).

    Example::

        with FileLock(out_dir.with_suffix(".lock"), "stage 'target'"):
            ...  # only one process at a time gets here
    """

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
        """Who holds (or last held) the lock, as written by the holder; ``{}`` when unknown.

        Args:
            settle: seconds to wait for a record that is not readable yet (a holder writes it just after it
                takes the lock, so a waiter that arrives in between would otherwise read nothing).
        """
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
        """Take the lock, waiting for the holder (at most ``timeout`` seconds; ``None``: as long as it takes).

        Raises:
            LockTimeout: the lock is still held after ``timeout`` seconds.
        """
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
