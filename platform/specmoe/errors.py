# SPDX-License-Identifier: Apache-2.0
"""User-facing errors: printed by the CLI as one clear message, never as a traceback."""

from __future__ import annotations

from typing import Optional

__all__ = ["UserError", "MissingExtraError", "StageIncomplete", "RunFailure", "StageFailed", "CellFailed",
           "require", "describe"]


class UserError(Exception):
    """Bad input or a missing resource: the message says what, where, and how to fix it."""


class MissingExtraError(UserError, ImportError):
    """An optional dependency group is not installed."""


class StageIncomplete(UserError):
    """A stage stopped before its budget's end (partial work kept; recorded incomplete; a rerun continues)."""


def describe(exc: BaseException) -> str:
    """``exc`` in one line: its message for a :class:`UserError`, else ``Type: message``."""
    text = str(exc).strip()
    if isinstance(exc, UserError):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class RunFailure(Exception):
    """A run failure: ``what`` names it, ``log`` is the traceback file, ``hint`` what to do; cause: ``__cause__``."""

    def __init__(self, what: str, cause: BaseException, hint: str = "", log: Optional[str] = None) -> None:
        self.what = what
        self.cause = cause
        self.hint = hint
        self.log = log
        super().__init__(f"{what} failed: {describe(cause)}")


class StageFailed(RunFailure):
    """A stage raised. ``stage_id`` / ``stage_name`` / ``out_dir`` say which one."""

    def __init__(self, stage_id: str, stage_name: str, out_dir: str, cause: BaseException) -> None:
        self.stage_id, self.stage_name, self.out_dir = stage_id, stage_name, out_dir
        incomplete = isinstance(cause, StageIncomplete)
        if incomplete:
            hint = ("its partial work is kept: rerun the same command to continue it, or raise its budget / "
                    "guard in the recipe")
        elif isinstance(cause, UserError):
            hint = ("fix what the message says and rerun the same command: finished stages are reused, and "
                    f"this one restarts cleanly (or resumes a valid checkpoint); 'platform cache clean "
                    f"{stage_id}' throws its work away")
        else:
            hint = ("rerun the same command to retry (finished stages are reused; this one restarts cleanly "
                    f"or resumes a valid checkpoint); 'platform cache clean {stage_id}' throws its work away; "
                    "if it fails again, the log holds the traceback to report")
        what = f"stage '{stage_id}' ({stage_name})"
        super().__init__(what, cause, hint)
        if incomplete:
            self.args = (f"{what} is incomplete: {describe(cause)}",)


class CellFailed(RunFailure):
    """An evaluation cell raised; ``cell`` is its label, e.g. ``ecospec / gsm8k / T=0.0 / γ=4 / bs=1``."""

    def __init__(self, cell: str, cause: BaseException) -> None:
        self.cell = cell
        hint = ("rerun the same command: finished stages and evaluation groups are reused, only unfinished "
                "prompts run again" + ("" if isinstance(cause, UserError) else
                                       "; if it fails again, the log holds the traceback to report"))
        super().__init__(f"evaluation cell {cell}", cause, hint)


def require(module: str, extra: str):
    """Import ``module`` or raise :class:`MissingExtraError` telling which extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"'{module}' is needed for this feature but is not installed: "
            f"pip install 'specmoe[{extra}]'  ({exc})") from exc
