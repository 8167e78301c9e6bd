# SPDX-License-Identifier: Apache-2.0
"""User-facing errors: printed as one clear message by the CLI, never as a traceback."""

from __future__ import annotations

__all__ = ["UserError", "MissingExtraError", "StageIncomplete", "require"]


class UserError(Exception):
    """Bad input or a missing resource: the message says what, where, and how to fix it."""


class StageIncomplete(UserError):
    """A stage stopped before its budget (e.g. by a wall-clock guard): it is not done, and a rerun resumes
    it from its checkpoint."""


class MissingExtraError(UserError, ImportError):
    """An optional dependency group is not installed."""


def require(module: str, extra: str):
    """Import ``module`` or raise :class:`MissingExtraError` telling which extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"'{module}' is needed for this feature but is not installed: "
            f"pip install 'specmoe[{extra}]'  ({exc})") from exc
