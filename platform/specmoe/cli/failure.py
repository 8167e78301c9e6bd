# SPDX-License-Identifier: Apache-2.0
"""How a failed command tells the user: one message, never a traceback (unless ``--debug``), saying what failed,
why (one line), where the log with the traceback is (a run's ``error.log``, else a temp file) and what to do next."""

from __future__ import annotations

import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import TextIO

from specmoe.errors import RunFailure, UserError, describe
from specmoe.utils.files import atomic_write

__all__ = ["report_failure", "write_log"]


def write_log(exc: BaseException, command: str) -> Path:
    """Write ``exc``'s traceback (causes included) to a new file under the temporary directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(tempfile.gettempdir()) / "specmoe-logs" / f"{command}-{stamp}-{id(exc) % 100000:05d}.log"
    atomic_write(path, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    return path


def report_failure(exc: BaseException, command: str, debug: bool = False, stream: TextIO | None = None) -> int:
    """Print the one message for ``exc`` (the traceback first with ``debug``); returns 2 for a user error, else 1."""
    stream = stream or sys.stderr
    if debug:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=stream)
    if isinstance(exc, UserError):  # the message already says what, where and how to fix it
        print(f"error: {exc}", file=stream)
        return 2
    if isinstance(exc, RunFailure):
        log = exc.log or str(write_log(exc, command))
        lines = [f"error: {exc}", f"  log:  {log} (full traceback)", f"  next: {exc.hint}"]
        code = 2 if isinstance(exc.cause, UserError) else 1
    else:
        log = str(write_log(exc, command))
        lines = [f"error: platform {command} failed: {describe(exc)}", f"  log:  {log} (full traceback)",
                 "  next: this looks like a bug in specmoe or in a plugin: rerun with --debug to see the "
                 "traceback here, and report it with the log"]
        code = 1
    if not debug:
        lines.append("  (--debug shows the traceback here)")
    print("\n".join(lines), file=stream)
    return code
