# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias of :mod:`specmoe.evaluation.report_plots`: the analysis figures moved to the evaluation side
(``tracking/`` is the MLflow adapter only). Every name still works, with a :class:`DeprecationWarning`; the alias
goes in the release :data:`specmoe.utils.deprecation.REMOVED_IN` names. Its import of the evaluation is the one
exception to "tracking imports no evaluation" (``ignore_imports`` of that contract in pyproject.toml)."""

from __future__ import annotations

from specmoe.evaluation import report_plots as _new
from specmoe.utils.deprecation import moved_names

__all__ = list(_new.__all__)  # served by __getattr__

__getattr__, __dir__ = moved_names(__name__, _new, __all__, use=None)
