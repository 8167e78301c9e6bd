# SPDX-License-Identifier: Apache-2.0
"""The metrics registry: every evaluation metric declared once (name, label, unit, computation, aggregation) for
the summary, MLflow, ``platform compare`` and plots; adding one is a :func:`register` call (see ``builtin``)."""

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
