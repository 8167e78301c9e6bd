# SPDX-License-Identifier: Apache-2.0
"""``platform bench <name> [options]``: run a benchmark and print its table.

Benchmarks come from :data:`specmoe.registry.benches`: every entry point in the group ``specmoe.benches`` (the
built-in ones are ``specmoe_plugins``'). One that cannot be imported is left out of the list with a
warning naming it and why (the others stay usable).
"""

from __future__ import annotations

import argparse
import logging

__all__ = ["add_parser", "run"]

logger = logging.getLogger(__name__)


def _unknown_bench(parser: argparse.ArgumentParser, inner: argparse._SubParsersAction) -> None:
    """An unknown bench name: one line naming it, the closest name, and every bench (core and plugins)."""
    check = parser._check_value

    def _check_value(action: argparse.Action, value: object) -> None:
        if action is inner and value not in inner.choices:
            import difflib

            names = sorted(inner.choices)
            close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            parser.error(f"unknown bench '{value}'.{hint} Available: {', '.join(names)} (the entry-point "
                         f"group 'specmoe.benches'; 'platform ls bench' says where each comes from)")
        check(action, value)

    parser._check_value = _check_value  # type: ignore[method-assign]


def _summary(module: object) -> str:
    doc = (getattr(module, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


def add_parser(sub: argparse._SubParsersAction) -> None:
    from specmoe.registry import benches

    p = sub.add_parser("bench", help="benchmarks: " + ", ".join(benches.names()))
    inner = p.add_subparsers(dest="bench", metavar="BENCH")
    _unknown_bench(p, inner)
    for name, target, origin in benches.entries():
        if "CONFLICT" in origin:
            continue  # reported once by the registry, naming both declarations
        try:
            module = benches.get(name)
        except Exception as exc:  # noqa: BLE001 - a broken plugin bench must not break the CLI
            logger.warning("bench '%s' (%s) is left out: %s", name, origin, exc)
            continue
        bp = inner.add_parser(name, help=f"{_summary(module)} [{target.split('.')[0]}]")
        module.add_arguments(bp)
        bp.set_defaults(func=module.run)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def run(args: argparse.Namespace) -> int:  # pragma: no cover - dispatch goes through set_defaults
    return int(args.func(args) or 0)
