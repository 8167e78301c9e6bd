# SPDX-License-Identifier: Apache-2.0
"""Experiment tracking (MLflow): run schema and tags, the :class:`Tracker` client, tracking URIs, provenance.
Importing it is cheap: mlflow and matplotlib load when a tracker is built / a figure is logged."""

from specmoe.tracking.client import FoundRun, NullRun, NullTracker, RunHandle, Tracker
from specmoe.tracking.environment import code_version, env_params, plugin_params
from specmoe.tracking.schema import (
    CELL_KIND,
    CELL_METRICS,
    CELL_OPTIONAL_TAGS,
    CELL_TAGS,
    ERROR_ARTIFACT,
    ERROR_TAG,
    PARENT_KIND,
    RECIPE_HASH_TAG,
    cell_run_name,
    cell_tags,
    flatten_params,
)
from specmoe.tracking.uri import check_uri, default_uri, resolve_uri

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
    "RECIPE_HASH_TAG",
    "cell_tags",
    "cell_run_name",
    "flatten_params",
    "default_uri",
    "resolve_uri",
    "check_uri",
    "env_params",
    "code_version",
    "plugin_params",
]
