# SPDX-License-Identifier: Apache-2.0
"""``platform compare --experiment NAME``: the paper's Table 1 and Table 3 from MLflow runs."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def _metric_names() -> tuple[str, ...]:
    from specmoe.metrics import names

    return names()


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="Table 1 (Spd / α / E) and Table 3 (latency breakdown) from MLflow runs",
        description="Print the paper's Table 1 (rows methods, columns datasets + Average) and Table 3 "
        "(latency breakdown) built from the finished cell runs of an MLflow experiment, one table per "
        "setting (temperature, γ, batch size; AR joins every γ of its temperature and batch size). "
        "By default only the latest recipe run (parent run) is used. Values with a confidence interval "
        "(paired bootstrap over the prompt batches of the cell's group) print as 1.03x [0.99, 1.07].",
    )
    p.add_argument(
        "--experiment", required=True, help="MLflow experiment name (default of a recipe: its name)"
    )
    p.add_argument(
        "--metric",
        nargs="+",
        default=["speedup", "alpha", "E"],
        metavar="METRIC",
        help="metrics shown in each Table 1 cell, in order (default: speedup alpha E); any of: "
        + ", ".join(_metric_names()),
    )
    p.add_argument("--uri", help="tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--run-id", help="use the cells of this parent run")
    which.add_argument(
        "--all-runs",
        action="store_true",
        help="use every parent run's cells (the latest run of each cell wins)",
    )
    p.add_argument(
        "--verdict",
        action="append",
        default=[],
        metavar="METHOD:BASELINE",
        help="judge METHOD against BASELINE in every cell (same dataset, temperature, batch size; either side "
        "may name a γ: goodput:eagle3@4): their tokens/s ratio on the same prompt batches with its "
        "confidence interval, faster / slower / not resolved, and the prompts the cell needs to resolve "
        "--margin; repeatable",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=0.02,
        help="relative margin the verdicts' prompt estimate is sized for (default 0.02: an interval of ±2 %%)",
    )
    p.add_argument("--format", choices=["text", "markdown", "csv"], default="text")
    p.add_argument("--out", help="also write the output to this file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specmoe.peer.compare import compare  # the cell tables, then bench peer's engine rows
    from specmoe.tracking.runs import resolve_uri

    text = compare(
        resolve_uri(args.uri),
        args.experiment,
        args.metric,
        run_id=args.run_id,
        all_runs=args.all_runs,
        fmt=args.format,
        verdict=args.verdict,
        margin=args.margin,
    )
    print(text, end="")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return 0
