# SPDX-License-Identifier: Apache-2.0
"""The metrics registry: every evaluation metric declared once (name, label, unit, how it is computed from
step records, whether it applies to AR, how it aggregates), used by the evaluation summary, MLflow logging,
``platform compare`` and the plots. Adding a metric is one :func:`register` call in
:mod:`specmoe.metrics.builtin` (or in a plugin module)."""

from specmoe.metrics import builtin as _builtin  # noqa: F401 - registers the built-in metrics (before any other)
from specmoe.metrics.registry import (
    METRICS,
    BatchTiming,
    CellData,
    Metric,
    derive,
    get,
    mean,
    names,
    register,
    summarize,
)

__all__ = ["METRICS", "Metric", "CellData", "BatchTiming", "register", "get", "names", "summarize", "derive",
           "mean"]
