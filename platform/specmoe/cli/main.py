# SPDX-License-Identifier: Apache-2.0
"""Entry point of the ``platform`` console script and ``python -m specmoe``."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Sequence

__all__ = ["main", "SUBCOMMANDS"]

#: subcommand name -> module defining ``add_parser(subparsers)`` and ``run(args) -> int``
SUBCOMMANDS = {
    "run": "specmoe.cli.run",
    "validate": "specmoe.cli.validate",
    "ls": "specmoe.cli.ls",
    "compare": "specmoe.cli.compare",
    "ui": "specmoe.cli.ui",
    "bench": "specmoe.cli.bench",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="platform", description="specmoe: cost-aware speculative decoding for MoE LLMs")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in SUBCOMMANDS.values():
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name == mod:  # subcommand not shipped in this version
                continue
            raise
        module.add_parser(sub)
    return parser


def _not_printed_by_lightning(record: logging.LogRecord) -> bool:
    """Lightning prints its messages with its own handler on the ``lightning`` logger: print them once."""
    return not (record.name.startswith("lightning") and logging.getLogger("lightning").handlers)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_not_printed_by_lightning)
    if not args.command:
        parser.print_help()
        return 2
    from specmoe.config.errors import ConfigError
    from specmoe.errors import UserError

    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(exc.report(), file=sys.stderr)
        return 2
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
