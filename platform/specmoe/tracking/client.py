# SPDX-License-Identifier: Apache-2.0
"""MLflow experiment tracking: one parent run per recipe run, one nested run per evaluation cell.

Only :class:`mlflow.MlflowClient` is used (never the fluent global "active run"), so several trackers, threads or
processes can log side by side, to any URI (sqlite, a tracking server, Databricks).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping
from urllib.parse import urlparse

from specmoe.tracking.schema import (
    ERROR_ARTIFACT,
    ERROR_TAG,
    MAX_TAG_VALUE,
    METRICS_PER_BATCH,
    PARAMS_PER_BATCH,
    flatten_params,
    records_csv,
    safe_key,
)
from specmoe.tracking.uri import check_uri, resolve_uri, sqlite_path
from specmoe.utils.files import FileLock

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from mlflow import MlflowClient

    from specmoe.config.schema import TrackingConfig

__all__ = ["Tracker", "NullTracker", "RunHandle", "NullRun", "FoundRun"]

logger = logging.getLogger(__name__)

@dataclass
class FoundRun:
    """A run found by :meth:`Tracker.find_run` (plain data, no MLflow objects)."""

    run_id: str
    name: str
    status: str
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


class RunHandle:
    """The open run yielded by :meth:`Tracker.run`. Every call logs immediately (batched)."""

    def __init__(self, client: MlflowClient, run_id: str, known_params: Mapping[str, str] | None = None):
        self._client = client
        self.run_id = run_id
        self._known = dict(known_params or {})

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log (nested) params as flattened dotted keys. Params are immutable in MLflow: re-logging a key
        with the same value is a no-op; a different value is skipped with a warning."""
        from mlflow.entities import Param

        flat = flatten_params(params)
        new = {}
        for k, v in flat.items():
            if k in self._known:
                if self._known[k] != v:
                    logger.warning("run %s: param %r already logged as %r; keeping it (new value %r)",
                                   self.run_id, k, self._known[k][:80], v[:80])
                continue
            new[k] = v
        items = list(new.items())
        for i in range(0, len(items), PARAMS_PER_BATCH):
            chunk = items[i:i + PARAMS_PER_BATCH]
            self._client.log_batch(self.run_id, params=[Param(k, v) for k, v in chunk])
        self._known.update(new)

    def log_metrics(self, metrics: Mapping[str, float | None], step: int | None = None) -> None:
        """Log numeric metrics (``None`` values are skipped)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(safe_key(k), float(v), now, int(step or 0)) for k, v in metrics.items()
                 if v is not None]
        for i in range(0, len(items), METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=items[i:i + METRICS_PER_BATCH])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(safe_key(k), str(v)[:MAX_TAG_VALUE]) for k, v in tags.items()]
        for i in range(0, len(items), PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, tags=items[i:i + PARAMS_PER_BATCH])

    def log_dict(self, obj: Any, path: str) -> None:
        """Log a JSON/YAML artifact (format from the extension of ``path``)."""
        self._client.log_dict(self.run_id, obj, path)

    def log_text(self, text: str, path: str) -> None:
        self._client.log_text(self.run_id, text, path)

    def log_table(self, rows: list[Mapping[str, Any]], path: str) -> None:
        """Log rows as a ``.json`` list of records, or as CSV (any other extension; columns in order of first
        appearance, list / dict values as JSON)."""
        if path.endswith(".json"):
            self._client.log_text(self.run_id, json.dumps(list(rows), default=str), path)
            return
        text = records_csv(rows, lambda v: json.dumps(v) if isinstance(v, (list, tuple, dict)) else v)
        self._client.log_text(self.run_id, text, path)

    def log_figure(self, fig: Figure, path: str, close: bool = True) -> None:
        """Log a matplotlib figure as an image artifact (PNG unless ``path`` says otherwise)."""
        self._client.log_figure(self.run_id, fig, path)
        if close and getattr(getattr(fig, "canvas", None), "manager", None) is not None:  # pyplot figure
            import matplotlib.pyplot as plt

            plt.close(fig)

    def log_artifact(self, local_path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Log a file, or every file under a directory."""
        p = Path(local_path)
        if p.is_dir():
            self._client.log_artifacts(self.run_id, str(p), artifact_path)
        else:
            self._client.log_artifact(self.run_id, str(p), artifact_path)


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


class _NullClient:
    """Accepts every MLflow client call and does nothing."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return _noop


class NullRun(RunHandle):
    """A run handle that records nothing (``tracking.enabled: false``); ``run_id`` is ``None``."""

    def __init__(self) -> None:
        super().__init__(_NullClient(), None)  # type: ignore[arg-type]


class NullTracker:
    """Same API as :class:`Tracker`; logs nothing (exceptions inside ``run`` still propagate)."""

    enabled = False
    uri: str | None = None
    experiment_id: str | None = None
    experiment_name: str | None = None

    @contextlib.contextmanager
    def run(self, name: str, params: Mapping[str, Any] | None = None, tags: Mapping[str, Any] | None = None,
            parent_run_id: str | None = None, run_id: str | None = None) -> Iterator[NullRun]:
        yield NullRun()

    def find_run(self, tags: Mapping[str, str], status: str | None = "FINISHED") -> FoundRun | None:
        return None


class Tracker:
    """MLflow tracking for one experiment (created if missing, restored if deleted) at ``uri``;
    ``artifact_location``: artifact root of a newly created experiment (``None``: the server's default)."""

    enabled = True

    def __init__(self, uri: str, experiment: str, artifact_location: str | None = None, check: bool = True):
        if check:
            check_uri(uri)
        db = sqlite_path(uri)
        # a new sqlite store is created (schema migrations) by one process at a time
        lock = FileLock(db.with_name(db.name + ".lock"), f"the MLflow store {db}") if db is not None else None
        with lock or contextlib.nullcontext():
            self._open(uri, experiment, artifact_location, db)

    def _open(self, uri: str, experiment: str, artifact_location: str | None, db: Path | None) -> None:
        from mlflow import MlflowClient

        logging.getLogger("alembic").setLevel(logging.WARNING)  # sqlite schema migrations on first use
        self.uri = uri
        self.experiment_name = experiment
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            loc = artifact_location
            if loc is not None and not urlparse(loc).scheme:  # a local path, maybe relative
                loc = Path(loc).expanduser().resolve().as_uri()
            if loc is None and db is not None:
                loc = (db.parent / "mlartifacts").resolve().as_uri()
            try:
                self.experiment_id = self.client.create_experiment(experiment, artifact_location=loc)
            except Exception:  # another process created it meanwhile
                exp = self.client.get_experiment_by_name(experiment)
                if exp is None:
                    raise
                self.experiment_id = exp.experiment_id
        else:
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            self.experiment_id = exp.experiment_id

    @classmethod
    def from_config(cls, tracking_cfg: TrackingConfig | None, default_experiment: str,
                    workdir: Path) -> "Tracker | NullTracker":
        """Build from a ``TrackingConfig`` (``None``: defaults; URI precedence: :func:`resolve_uri`). A sqlite
        store keeps artifacts in ``<dir of the db>/mlartifacts`` unless ``tracking.artifact_location`` is set."""
        if tracking_cfg is not None and not getattr(tracking_cfg, "enabled", True):
            return NullTracker()
        uri = resolve_uri(tracking_cfg, workdir)
        experiment = getattr(tracking_cfg, "experiment", None) or default_experiment
        return cls(uri, experiment, getattr(tracking_cfg, "artifact_location", None))

    resolve_uri = staticmethod(resolve_uri)

    @contextlib.contextmanager
    def run(self, name: str, params: Mapping[str, Any] | None = None, tags: Mapping[str, Any] | None = None,
            parent_run_id: str | None = None, run_id: str | None = None) -> Iterator[RunHandle]:
        """Open a run (new, nested under ``parent_run_id``, or the existing ``run_id`` reopened). It ends FINISHED
        on a normal exit; on an exception FAILED (KILLED for Ctrl-C) with the error in the ``specmoe.error`` tag
        and the traceback in ``error.txt``, and the exception is re-raised."""
        all_tags = {str(k): str(v)[:MAX_TAG_VALUE] for k, v in (tags or {}).items()}
        if parent_run_id:
            all_tags.setdefault("mlflow.parentRunId", parent_run_id)
            all_tags.setdefault("specmoe.parent", parent_run_id)
        if run_id is not None:
            existing = self.client.get_run(run_id)
            self.client.update_run(run_id, status="RUNNING")
            handle = RunHandle(self.client, run_id, existing.data.params)
            handle.set_tags({k: v for k, v in all_tags.items() if k != "mlflow.parentRunId"})
        else:
            created = self.client.create_run(self.experiment_id, tags=all_tags, run_name=name)
            handle = RunHandle(self.client, created.info.run_id)
        try:
            if params:
                handle.log_params(params)
            yield handle
        except BaseException as exc:
            self._fail(handle, exc)
            raise
        if run_id is not None:
            self._clear_error(run_id)
        self.client.set_terminated(handle.run_id, status="FINISHED")

    def _clear_error(self, run_id: str) -> None:
        """A reopened run that finished: drop the error record of the attempt that failed before."""
        run = self.client.get_run(run_id)
        if ERROR_TAG in run.data.tags:
            self.client.delete_tag(run_id, ERROR_TAG)
        if not any(f.path == ERROR_ARTIFACT for f in self.client.list_artifacts(run_id)):
            return
        try:
            from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

            get_artifact_repository(run.info.artifact_uri).delete_artifacts(ERROR_ARTIFACT)
        except Exception as exc:  # noqa: BLE001 - a store that cannot delete: say it is resolved instead
            logger.debug("cannot delete %s of run %s (%s); marking it resolved", ERROR_ARTIFACT, run_id, exc)
            self.client.log_text(run_id, "resolved: the run was resumed and finished\n", ERROR_ARTIFACT)

    def end_stale_children(self, parent_run_id: str) -> list[str]:
        """Mark KILLED the runs nested under ``parent_run_id`` that are still RUNNING: they belong to an
        attempt that was killed (call only when no other process works on this parent). Returns their ids."""
        runs = self.client.search_runs([self.experiment_id], filter_string=(
            f"tags.`mlflow.parentRunId` = '{parent_run_id}' and attributes.status = 'RUNNING'"), max_results=1000)
        for r in runs:
            self.client.set_tag(r.info.run_id, ERROR_TAG, "killed: its process ended without closing it; the "
                                                          "parent run was resumed")
            self.client.set_terminated(r.info.run_id, status="KILLED")
        return [r.info.run_id for r in runs]

    def _fail(self, handle: RunHandle, exc: BaseException) -> None:
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        try:
            handle.set_tags({ERROR_TAG: f"{type(exc).__name__}: {exc}"})
            handle.log_text("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                            ERROR_ARTIFACT)
        except Exception as log_exc:  # the store may be what failed; still try to close the run
            logger.warning("could not record the error of run %s: %s", handle.run_id, log_exc)
        try:
            self.client.set_terminated(handle.run_id, status=status)
        except Exception as log_exc:
            logger.warning("could not mark run %s %s: %s", handle.run_id, status, log_exc)

    def find_run(self, tags: Mapping[str, str], status: str | None = "FINISHED") -> FoundRun | None:
        """The latest run of this experiment carrying all ``tags`` (and ``status``; ``None``: any)."""
        clauses, leftover = [], {}
        for k, v in tags.items():
            lit = _literal(str(v))
            if lit is None:
                leftover[k] = str(v)
            else:
                clauses.append(f"tags.`{k}` = {lit}")
        if status:
            clauses.append(f"attributes.status = '{status}'")
        runs = self.client.search_runs([self.experiment_id], filter_string=" and ".join(clauses),
                                       order_by=["attributes.start_time DESC"],
                                       max_results=200 if leftover else 1)
        runs = [r for r in runs if all(r.data.tags.get(k) == v for k, v in leftover.items())]
        if not runs:
            return None
        r = runs[0]
        return FoundRun(r.info.run_id, r.info.run_name or "", r.info.status, dict(r.data.tags),
                        dict(r.data.params), dict(r.data.metrics))


def _literal(value: str) -> str | None:
    """A filter-string literal for ``value`` (``None`` when it holds both quote characters)."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    return None
