# SPDX-License-Identifier: Apache-2.0
"""MLflow experiment tracking: one parent run per recipe run, one nested run per evaluation cell.

The tracker talks to MLflow only through :class:`mlflow.MlflowClient` (never the fluent global
"active run" state), so several trackers, threads or processes can log side by side and any URI works:
the default embedded sqlite store in the working directory, a tracking server (Postgres behind it),
or Databricks.

Example::

    tracker = Tracker.from_config(cfg.tracking, default_experiment=cfg.name, workdir=Path.cwd())
    with tracker.run("recipe", params=to_plain(cfg), tags={"specmoe.kind": PARENT_KIND}) as parent:
        tags = cell_tags("ecospec", "gsm8k", 0.0, 4, 1, parent=parent.run_id)
        if tracker.find_run(tags) is None:
            with tracker.run(cell_run_name(tags), tags=tags, parent_run_id=parent.run_id) as cell:
                cell.log_metrics({"speedup": 1.3, "alpha": 2.5, "E": 21.0})
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import os
import re
import time
import traceback
from dataclasses import dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping
from urllib.parse import urlparse

__all__ = ["Tracker", "NullTracker", "RunHandle", "NullRun", "FoundRun", "CELL_METRICS", "CELL_TAGS",
           "CELL_OPTIONAL_TAGS", "CELL_KIND", "PARENT_KIND", "ERROR_TAG", "ERROR_ARTIFACT", "cell_tags",
           "cell_run_name", "flatten_params", "default_uri", "env_params"]

logger = logging.getLogger(__name__)

#: metric names of a nested cell run (logged by the evaluation; read by ``platform compare``).
CELL_METRICS = ("speedup", "alpha", "E", "E_pred", "expert_bytes_per_step", "expert_bytes_per_step_loaded",
                "t_pred", "t_draft", "t_select", "t_verify", "t_total", "rho", "tokens_per_s", "predictor_accuracy",
                "matches_ar")
#: tags identifying a nested cell run.
CELL_TAGS = ("specmoe.kind", "specmoe.method", "specmoe.dataset", "specmoe.temperature", "specmoe.budget",
             "specmoe.batch_size", "specmoe.parent")
#: optional cell tags ``platform compare`` understands: ``"true"`` marks the AR baseline row / an
#: analysis-only method (oracle expert sets: its speedup is not a real one).
CELL_OPTIONAL_TAGS = ("specmoe.ar", "specmoe.analysis_only")
CELL_KIND = "cell"
PARENT_KIND = "recipe"
ERROR_TAG = "specmoe.error"
ERROR_ARTIFACT = "error.txt"

_MAX_KEY = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
_MAX_PARAM_VALUE = 6000  # MAX_PARAM_VAL_LENGTH
_MAX_TAG_VALUE = 8000  # MAX_TAG_VAL_LENGTH
_PARAMS_PER_BATCH = 100  # MAX_PARAMS_TAGS_PER_BATCH
_METRICS_PER_BATCH = 1000  # MAX_METRICS_PER_BATCH
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")


def _fmt_float(value: float) -> str:
    return repr(float(value))


def cell_tags(method: str, dataset: str, temperature: float, budget: int, batch_size: int,
              parent: str | None = None) -> dict[str, str]:
    """The canonical tags of one evaluation cell (values formatted the same way on log and search).

    Args:
        method: method name from the recipe.
        dataset: dataset name (registry key or recipe label).
        temperature: target decoding temperature (formatted as ``repr(float)``: ``"0.0"``, ``"1.0"``).
        budget: gamma, tokens verified per step including the bonus token.
        batch_size: generation batch size.
        parent: run id of the parent (recipe) run.
    """
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
    """Flatten nested mappings / lists / dataclasses to ``{"a.b.0.c": "value"}``.

    Lists of scalars stay one JSON value (``eval.temperatures = "[0.0, 1.0]"``); lists holding mappings
    are indexed. Keys are made MLflow-safe (invalid characters become ``_``, at most 250 characters) and
    values are truncated to MLflow's 6000-character limit.
    """
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
            out[_safe_key(key or "value")] = text[:_MAX_PARAM_VALUE]

    walk(obj, prefix)
    return out


def _safe_key(key: str) -> str:
    key = _BAD_KEY_CHARS.sub("_", key).strip("/") or "_"
    return key[:_MAX_KEY]


def default_uri(workdir: Path) -> str:
    """``sqlite:///<workdir>/mlflow.db`` (absolute)."""
    return f"sqlite:///{(Path(workdir).resolve() / 'mlflow.db').as_posix()}"


def _sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):]
    return Path(path) if path and path != ":memory:" else None


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

    def __init__(self, client: Any, run_id: str, known_params: Mapping[str, str] | None = None):
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
        for i in range(0, len(items), _PARAMS_PER_BATCH):
            chunk = items[i:i + _PARAMS_PER_BATCH]
            self._client.log_batch(self.run_id, params=[Param(k, v) for k, v in chunk])
        self._known.update(new)

    def log_metrics(self, metrics: Mapping[str, float | None], step: int | None = None) -> None:
        """Log numeric metrics (``None`` values are skipped)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(_safe_key(k), float(v), now, int(step or 0)) for k, v in metrics.items()
                 if v is not None]
        for i in range(0, len(items), _METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=items[i:i + _METRICS_PER_BATCH])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(_safe_key(k), str(v)[:_MAX_TAG_VALUE]) for k, v in tags.items()]
        for i in range(0, len(items), _PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, tags=items[i:i + _PARAMS_PER_BATCH])

    def log_dict(self, obj: Any, path: str) -> None:
        """Log a JSON/YAML artifact (format from the extension of ``path``)."""
        self._client.log_dict(self.run_id, obj, path)

    def log_text(self, text: str, path: str) -> None:
        self._client.log_text(self.run_id, text, path)

    def log_table(self, rows: list[Mapping[str, Any]], path: str) -> None:
        """Log rows as a ``.json`` (list of records) or CSV artifact (any other extension).

        CSV columns are the union of the rows' keys in order of first appearance; list / dict values are
        written as JSON.
        """
        if path.endswith(".json"):
            self._client.log_text(self.run_id, json.dumps(list(rows), default=str), path)
            return
        cols: dict[str, None] = {}
        for row in rows:
            cols.update(dict.fromkeys(row))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(cols), lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, (list, tuple, dict)) else v
                             for k, v in row.items()})
        self._client.log_text(self.run_id, buf.getvalue(), path)

    def log_figure(self, fig: Any, path: str, close: bool = True) -> None:
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

    def __getattr__(self, name: str) -> Any:
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
    """MLflow tracking for one experiment.

    Args:
        uri: tracking URI (``sqlite:///...``, ``http://host:5000``, ``databricks``, ...).
        experiment: experiment name; created if missing (with ``artifact_location``), restored if deleted.
        artifact_location: artifact root for a newly created experiment (``None``: the server's default).
    """

    enabled = True

    def __init__(self, uri: str, experiment: str, artifact_location: str | None = None):
        from mlflow import MlflowClient

        logging.getLogger("alembic").setLevel(logging.WARNING)  # sqlite schema migrations on first use
        db = _sqlite_path(uri)
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
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
    def from_config(cls, tracking_cfg: Any, default_experiment: str,
                    workdir: Path) -> "Tracker | NullTracker":
        """Build from a :class:`~specmoe.config.schema.TrackingConfig` (``None``: defaults).

        URI precedence: ``tracking.uri`` > ``$MLFLOW_TRACKING_URI`` > ``sqlite:///<workdir>/mlflow.db``;
        with a sqlite store the artifacts go to ``<dir of the db>/mlartifacts`` unless
        ``tracking.artifact_location`` says otherwise.
        """
        if tracking_cfg is not None and not getattr(tracking_cfg, "enabled", True):
            return NullTracker()
        uri = cls.resolve_uri(tracking_cfg, workdir)
        experiment = getattr(tracking_cfg, "experiment", None) or default_experiment
        return cls(uri, experiment, getattr(tracking_cfg, "artifact_location", None))

    @staticmethod
    def resolve_uri(tracking_cfg: Any, workdir: Path) -> str:
        """``tracking.uri`` > ``$MLFLOW_TRACKING_URI`` > ``sqlite:///<workdir>/mlflow.db``."""
        return (getattr(tracking_cfg, "uri", None) or os.environ.get("MLFLOW_TRACKING_URI")
                or default_uri(workdir))

    @contextlib.contextmanager
    def run(self, name: str, params: Mapping[str, Any] | None = None, tags: Mapping[str, Any] | None = None,
            parent_run_id: str | None = None, run_id: str | None = None) -> Iterator[RunHandle]:
        """Open a run (new, nested under ``parent_run_id``, or the existing ``run_id`` reopened).

        The run ends FINISHED when the block exits normally; on an exception it ends FAILED (KILLED for
        Ctrl-C) with the error in the ``specmoe.error`` tag and the traceback in ``error.txt``, and the
        exception is re-raised.
        """
        all_tags = {str(k): str(v)[:_MAX_TAG_VALUE] for k, v in (tags or {}).items()}
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
        self.client.set_terminated(handle.run_id, status="FINISHED")

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

_PACKAGES = ("specmoe", "torch", "transformers", "lightning", "torchmetrics", "mlflow", "triton")


def env_params() -> dict[str, str]:
    """Versions, git sha and hardware, as flat ``env.*`` params.

    * ``env.pkg.<dist>``: specmoe, torch, transformers, lightning, torchmetrics, mlflow, triton (when
      installed) and every distribution that provides ``specmoe.*`` entry points (plugins);
    * ``env.git.sha`` / ``env.git.dirty``: of the repository holding the specmoe sources, if any;
    * ``env.hw.*``: CPU model and cores, GPU names and memory (only when torch is importable and CUDA is
      available), python version.
    """
    import platform as std_platform
    from importlib import metadata

    out: dict[str, str] = {"env.python": std_platform.python_version()}
    dists = {name: None for name in _PACKAGES}
    try:
        for ep in metadata.entry_points():
            if ep.group.startswith("specmoe.") and ep.dist is not None:
                dists.setdefault(ep.dist.name, None)
    except Exception as exc:  # broken metadata of an unrelated distribution
        logger.debug("entry point scan failed: %s", exc)
    for name in dists:
        try:
            out[f"env.pkg.{name}"] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    out.update(_git_info())
    out.update(_hardware())
    return out


def _git_info() -> dict[str, str]:
    import subprocess

    import specmoe

    src = Path(specmoe.__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True,
                             timeout=10)
        if sha.returncode != 0:
            return {}
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=src,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"env.git.sha": sha.stdout.strip(), "env.git.dirty": str(bool(dirty.stdout.strip())).lower()}


def _hardware() -> dict[str, str]:
    import platform as std_platform

    cpu = std_platform.processor() or std_platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    out = {"env.hw.cpu": cpu, "env.hw.cpu_count": str(os.cpu_count() or 0)}
    try:
        import torch
    except ImportError:
        return out
    if torch.cuda.is_available():
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        out["env.hw.gpu_count"] = str(len(props))
        out["env.hw.gpus"] = ", ".join(p.name for p in props)
        out["env.hw.gpu_memory_gb"] = ", ".join(f"{p.total_memory / 2**30:.1f}" for p in props)
        out["env.hw.cuda"] = str(torch.version.cuda)
    else:
        out["env.hw.gpu_count"] = "0"
    return out
