# SPDX-License-Identifier: Apache-2.0
"""``platform bench <name> [options]``: run a benchmark and print its table."""

from __future__ import annotations

import argparse
import importlib

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    from specmoe.bench import BENCHES

    p = sub.add_parser("bench", help="benchmarks: " + ", ".join(BENCHES))
    inner = p.add_subparsers(dest="bench", metavar="BENCH")
    for name, mod in BENCHES.items():
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name == mod:
                continue
            raise
        bp = inner.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        module.add_arguments(bp)
        bp.set_defaults(func=module.run)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def run(args: argparse.Namespace) -> int:  # pragma: no cover - dispatch goes through set_defaults
    return int(args.func(args) or 0)
