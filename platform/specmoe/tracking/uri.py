# SPDX-License-Identifier: Apache-2.0
"""Tracking URIs: the default store, precedence, and :func:`check_uri`, which reports a store that does not answer
or an unknown scheme before any work starts, in seconds (not after MLflow's minutes of retries)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional
from urllib.parse import urlparse

from specmoe.errors import UserError

if TYPE_CHECKING:
    from specmoe.config.schema import TrackingConfig

__all__ = ["default_uri", "sqlite_path", "resolve_uri", "check_uri", "SUPPORTED_SCHEMES"]

#: URI schemes MLflow tracking accepts (databases may carry a driver: ``postgresql+psycopg2``)
SUPPORTED_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc",
                     "file")
_DB_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
_FIX = ("start it, point tracking.uri (or $MLFLOW_TRACKING_URI) at a store that runs, or run without "
        "tracking: tracking.enabled=false")


def default_uri(workdir: Path) -> str:
    """``sqlite:///<workdir>/mlflow.db`` (absolute)."""
    return f"sqlite:///{(Path(workdir).resolve() / 'mlflow.db').as_posix()}"


def sqlite_path(uri: str) -> Optional[Path]:
    """The database file of a ``sqlite:///`` URI (``None`` for other URIs and in-memory databases)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):]
    return Path(path) if path and path != ":memory:" else None


def resolve_uri(uri: str | TrackingConfig | None = None, workdir: Path | None = None, *, existing: bool = False) -> str:
    """``uri`` (a string, or a config's ``.uri``) > ``$MLFLOW_TRACKING_URI`` > ``sqlite:///<workdir>/mlflow.db``
    (``workdir`` default: cwd). ``existing`` (readers): a missing default ``mlflow.db`` raises :class:`UserError`
    instead of making a new empty store."""
    if uri is not None and not isinstance(uri, str):
        uri = getattr(uri, "uri", None)
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    workdir = Path(workdir or Path.cwd())
    if existing and not (workdir / "mlflow.db").is_file():
        raise UserError(f"no MLflow store found: {workdir / 'mlflow.db'} does not exist. Run from the "
                        "directory where the recipe ran, or pass --uri (or set MLFLOW_TRACKING_URI)")
    return default_uri(workdir)


def _connect(host: str, port: int, timeout: float) -> Optional[str]:
    """``None`` when a TCP connection to ``host:port`` opens, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def check_uri(uri: str, timeout: float = 5.0) -> None:
    """Raise :class:`UserError` for an unknown scheme, a server / database not accepting connections within
    ``timeout`` seconds, or an uncreatable sqlite directory; credentials and databricks are left to MLflow."""
    t0 = time.monotonic()
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    base = scheme.split("+")[0]
    if not scheme or (len(scheme) == 1 and os.name == "nt"):  # a plain local path (file store)
        return
    if base not in SUPPORTED_SCHEMES:
        raise UserError(f"tracking URI '{uri}': unknown scheme '{scheme}'. MLflow takes "
                        f"{', '.join(s + ':' for s in SUPPORTED_SCHEMES)} or a local path; fix tracking.uri (or "
                        f"$MLFLOW_TRACKING_URI), or run without tracking: tracking.enabled=false")
    if base == "sqlite":
        db = sqlite_path(uri)
        if db is not None:
            try:
                db.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UserError(f"tracking URI '{uri}': cannot create {db.parent} ({exc.strerror}); {_FIX}") \
                    from None
        return
    if base in ("http", "https") or base in _DB_PORTS:
        host = parsed.hostname
        if not host:
            raise UserError(f"tracking URI '{uri}' names no host; {_FIX}")
        port = parsed.port or (_DB_PORTS.get(base) or (443 if base == "https" else 80))
        why = _connect(host, port, timeout)
        if why is not None:
            raise UserError(f"tracking URI '{uri}' is not reachable: {host}:{port} {why.lower()} (checked in "
                            f"{time.monotonic() - t0:.1f} s, before any work); {_FIX}")
        if base in ("http", "https"):
            _check_server(uri, timeout)


def _check_server(uri: str, timeout: float) -> None:
    """Something answers at ``uri``: make sure it is an MLflow tracking server (its REST API answers)."""
    import urllib.error
    import urllib.request

    url = uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1"
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):  # a server that wants credentials: MLflow sends them
            return
        raise UserError(f"tracking URI '{uri}' answers, but not as an MLflow tracking server (HTTP {exc.code} from "
                        f"its REST API); {_FIX}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(f"tracking URI '{uri}' did not answer within {timeout:.0f} s ({reason}); {_FIX}") from None
