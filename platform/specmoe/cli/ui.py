# SPDX-License-Identifier: Apache-2.0
"""``platform ui``: the MLflow UI on 127.0.0.1 for the local (or given) tracking store."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run", "ui_command"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ui",
        help="start the MLflow UI on 127.0.0.1 (compare runs in the browser)",
        description="Serve the MLflow UI for the tracking store on http://127.0.0.1:PORT. Cell "
        "runs are nested under their recipe run; filter with e.g. "
        "tags.`specmoe.kind` = 'cell' and compare metrics across runs.",
    )
    p.add_argument("--uri", help="backend store URI (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--workers", type=int, default=1, help="server worker processes (default: 1)")
    p.set_defaults(func=run)


def ui_command(uri: str, port: int, workers: int = 1) -> list[str]:
    import sys

    return [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]


def run(args: argparse.Namespace) -> int:
    import os
    import signal
    import subprocess

    from specmoe.tracking.runs import resolve_uri

    uri = resolve_uri(args.uri)
    if uri.startswith(("http://", "https://", "databricks")):
        print(f"{uri} is a tracking server with its own UI: open it in a browser")
        return 0
    # the UI needs no background job runner (it would start extra consumer processes)
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    print(f"MLflow UI for {uri}: http://127.0.0.1:{args.port}  (Ctrl-C to stop)", flush=True)
    proc = subprocess.Popen(ui_command(uri, args.port, args.workers), env=env)
    # SIGTERM (e.g. from a job runner) stops the server the way Ctrl-C does
    signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGINT))
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait()
        return 0
