# SPDX-License-Identifier: Apache-2.0
"""Reading cell runs back from an MLflow store: which store, an experiment's finished cell runs, a run's JSON
artifacts (turning runs into results: :mod:`specmoe.evaluation.report_tables`)."""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from specmoe.errors import UserError
from specmoe.tracking.schema import CELL_KIND
from specmoe.tracking.uri import resolve_uri as _resolve_uri

if TYPE_CHECKING:
    from mlflow.entities import Run

__all__ = ["resolve_uri", "search_cell_runs", "json_artifacts"]


#: the store a reader opens: :func:`specmoe.tracking.uri.resolve_uri` with ``existing=True``
resolve_uri: Callable[..., str] = functools.partial(_resolve_uri, existing=True)


def search_cell_runs(uri: str, experiment: str, run_id: str | None = None) -> list[Run]:
    """``experiment``'s FINISHED cell runs (of parent ``run_id`` if given), as MLflow ``Run`` s by start time."""
    from mlflow import MlflowClient

    from specmoe.tracking.uri import check_uri

    check_uri(uri)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise UserError(f"experiment {experiment!r} not found at {uri}; experiments there: "
                        f"{', '.join(names) or '(none)'}")
    flt = f"tags.`specmoe.kind` = '{CELL_KIND}' and attributes.status = 'FINISHED'"
    if run_id and not re.fullmatch(r"[\w-]+", run_id):
        raise UserError(f"--run-id {run_id!r} is not an MLflow run id (letters, digits, '_', '-')")
    if run_id:
        flt += f" and tags.`specmoe.parent` = '{run_id}'"
    runs, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], filter_string=flt, max_results=1000, page_token=token,
                                  order_by=["attributes.start_time ASC"])
        runs += list(page)
        token = page.token
        if not token:
            break
    return runs


@contextmanager
def json_artifacts(uri: str) -> Iterator[Callable[[str, str], Any]]:
    """A reader ``read(run_id, name)`` -> the parsed JSON artifact ``name`` of a run, or ``None`` where the run
    has none (MLflow's per-download progress bar off meanwhile); errors of the store propagate."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)

    def read(run_id: str, name: str) -> Any:
        if not any(f.path == name for f in client.list_artifacts(run_id)):
            return None
        with tempfile.TemporaryDirectory() as tmp:
            return json.loads(Path(client.download_artifacts(run_id, name, tmp)).read_text())

    bar = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"  # one bar per run otherwise
    try:
        yield read
    finally:
        if bar is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = bar
