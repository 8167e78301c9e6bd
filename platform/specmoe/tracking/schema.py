# SPDX-License-Identifier: Apache-2.0
"""What specmoe writes to MLflow: run kinds, cell tags, error records and flattened params.
One parent run per recipe run (``specmoe.kind=recipe``), one nested run per cell (``specmoe.kind=cell``)."""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import is_dataclass
from typing import Any, Callable, Iterable, Mapping

__all__ = ["records_csv", "CELL_METRICS", "CELL_TAGS", "CELL_OPTIONAL_TAGS", "CELL_KIND", "PARENT_KIND", "ERROR_TAG",
           "ERROR_ARTIFACT", "RECIPE_HASH_TAG", "cell_tags", "cell_run_name", "flatten_params", "safe_key",
           "MAX_TAG_VALUE", "PARAMS_PER_BATCH", "METRICS_PER_BATCH", "BATCHES_ARTIFACT", "PROMPT_BATCHES"]


def _metric_names() -> tuple[str, ...]:
    from specmoe.metrics import names

    return names()


#: metric names of a nested cell run.
CELL_METRICS = _metric_names()
#: tags identifying a nested cell run.
CELL_TAGS = ("specmoe.kind", "specmoe.method", "specmoe.dataset", "specmoe.temperature", "specmoe.budget",
             "specmoe.batch_size", "specmoe.parent")
#: optional cell tags: ``"true"`` marks the AR baseline row / an analysis-only method (speedup not a real one).
CELL_OPTIONAL_TAGS = ("specmoe.ar", "specmoe.analysis_only")
CELL_KIND = "cell"
PARENT_KIND = "recipe"
ERROR_TAG = "specmoe.error"
ERROR_ARTIFACT = "error.txt"
#: a cell run's per-batch values (``CellResult.batches``): what ``platform compare`` pairs methods from
BATCHES_ARTIFACT = "batches.json"
#: the MLflow metric holding a cell's number of prompt batches
PROMPT_BATCHES = "prompt_batches"
RECIPE_HASH_TAG = "specmoe.recipe_hash"

MAX_KEY = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
MAX_PARAM_VALUE = 6000  # MAX_PARAM_VAL_LENGTH
MAX_TAG_VALUE = 8000  # MAX_TAG_VAL_LENGTH
PARAMS_PER_BATCH = 100  # MAX_PARAMS_TAGS_PER_BATCH
METRICS_PER_BATCH = 1000  # MAX_METRICS_PER_BATCH
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")


def _fmt_float(value: float) -> str:
    return repr(float(value))


def cell_tags(method: str, dataset: str, temperature: float, budget: int, batch_size: int,
              parent: str | None = None) -> dict[str, str]:
    """The canonical tags of one evaluation cell, formatted the same way on log and search (``temperature`` as
    ``repr(float)``: ``"0.0"``); ``budget``: gamma, bonus token included; ``parent``: the recipe run's id."""
    tags = {"specmoe.kind": CELL_KIND, "specmoe.method": str(method), "specmoe.dataset": str(dataset),
            "specmoe.temperature": _fmt_float(temperature), "specmoe.budget": str(int(budget)),
            "specmoe.batch_size": str(int(batch_size))}
    if parent:
        tags["specmoe.parent"] = parent
    return tags


def cell_run_name(tags: Mapping[str, str]) -> str:
    """A readable run name for a cell, e.g. ``ecospec/gsm8k/T=0.0/g=4/bs=1``."""
    return (f"{tags['specmoe.method']}/{tags['specmoe.dataset']}/T={tags['specmoe.temperature']}"
            f"/g={tags['specmoe.budget']}/bs={tags['specmoe.batch_size']}")


def flatten_params(obj: Any, prefix: str = "") -> dict[str, str]:
    """Flatten nested mappings / lists / dataclasses to ``{"a.b.0.c": "value"}``: lists of scalars stay one JSON
    value, lists holding containers are indexed; keys are made MLflow-safe, values cut to MLflow's limit."""
    if is_dataclass(obj) and not isinstance(obj, type):
        from specmoe.config.validate import to_plain

        obj = to_plain(obj)
    out: dict[str, str] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, Mapping):
            if not value and key:
                out[key] = "{}"
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, (list, tuple)) and any(isinstance(v, (Mapping, list, tuple)) for v in value):
            for i, v in enumerate(value):
                walk(v, f"{key}.{i}" if key else str(i))
        else:
            if isinstance(value, (list, tuple)):
                text = json.dumps(list(value), default=str)
            else:
                text = str(value)
            out[safe_key(key or "value")] = text[:MAX_PARAM_VALUE]

    walk(obj, prefix)
    return out


def safe_key(key: str) -> str:
    key = _BAD_KEY_CHARS.sub("_", key).strip("/") or "_"
    return key[:MAX_KEY]


def records_csv(rows: Iterable[Mapping[str, Any]], value: Callable[[Any], Any] = lambda v: v) -> str:
    """Rows as CSV text: the columns are the union of the rows' keys in order of first appearance, each value
    written as ``value(v)``."""
    rows = list(rows)
    cols: dict[str, None] = {}
    for row in rows:
        cols.update(dict.fromkeys(row))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(cols), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: value(v) for k, v in row.items()} for row in rows)
    return buf.getvalue()
