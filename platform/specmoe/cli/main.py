# SPDX-License-Identifier: Apache-2.0
"""Entry point of the ``platform`` console script and ``python -m specmoe``."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Sequence

__all__ = ["main", "SUBCOMMANDS"]

#: core subcommand -> module with ``add_parser(subparsers)`` and ``run(args) -> int`` (plugins: ``specmoe.commands``)
SUBCOMMANDS = {
    "run": "specmoe.cli.run",
    "validate": "specmoe.cli.validate",
    "ls": "specmoe.cli.ls",
    "compare": "specmoe.cli.compare",
    "ui": "specmoe.cli.ui",
    "bench": "specmoe.cli.bench",
    "cache": "specmoe.cli.cache",
    "traces": "specmoe.cli.traces",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="platform", description="specmoe: cost-aware speculative decoding for MoE LLMs")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of a failure")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in SUBCOMMANDS.values():
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name == mod:  # subcommand not shipped in this version
                continue
            raise
        module.add_parser(sub)
    _plugin_commands(sub)
    return parser


def _plugin_commands(sub: argparse._SubParsersAction) -> None:
    """Add each plugin's subcommand (``specmoe.commands``); a broken or name-taken one is left out with a warning."""
    from specmoe.registry import commands

    for name, _target, origin in commands.entries():
        if name in SUBCOMMANDS or "CONFLICT" in origin:
            logging.getLogger(__name__).warning("command '%s' (%s) is left out: the name is taken", name, origin)
            continue
        try:
            module = commands.get(name)
        except Exception as exc:  # noqa: BLE001 - a broken plugin command must not break the CLI
            logging.getLogger(__name__).warning("command '%s' (%s) is left out: %s", name, origin, exc)
            continue
        module.add_parser(sub)


def _not_printed_by_lightning(record: logging.LogRecord) -> bool:
    """Lightning prints its messages with its own handler on the ``lightning`` logger: print them once."""
    return not (record.name.startswith("lightning") and logging.getLogger("lightning").handlers)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # accepted anywhere on the line: `platform run x.yaml --debug`
    args = parser.parse_args([a for a in argv if a != "--debug"])
    args.debug = debug
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_not_printed_by_lightning)
    if not args.command:
        parser.print_help()
        return 2
    from specmoe.cli.failure import report_failure
    from specmoe.config.errors import ConfigError

    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(exc.report(), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - every failure ends in one message (the log has the traceback)
        return report_failure(exc, args.command, debug=args.debug)


if __name__ == "__main__":
    raise SystemExit(main())
