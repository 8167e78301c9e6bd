# SPDX-License-Identifier: Apache-2.0
"""Experiment tracking (MLflow), the paper-table comparison and the analysis plots.

Importing this package is cheap: mlflow and matplotlib load when a tracker is built / a figure is drawn.
"""

from specmoe.tracking.tracker import (
    CELL_KIND,
    CELL_METRICS,
    CELL_OPTIONAL_TAGS,
    CELL_TAGS,
    ERROR_ARTIFACT,
    ERROR_TAG,
    PARENT_KIND,
    FoundRun,
    NullRun,
    NullTracker,
    RunHandle,
    Tracker,
    cell_run_name,
    cell_tags,
    default_uri,
    env_params,
    flatten_params,
)

__all__ = [
    "Tracker",
    "NullTracker",
    "RunHandle",
    "NullRun",
    "FoundRun",
    "CELL_METRICS",
    "CELL_TAGS",
    "CELL_OPTIONAL_TAGS",
    "CELL_KIND",
    "PARENT_KIND",
    "ERROR_TAG",
    "ERROR_ARTIFACT",
    "cell_tags",
    "cell_run_name",
    "flatten_params",
    "default_uri",
    "env_params",
]
