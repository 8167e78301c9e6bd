# SPDX-License-Identifier: Apache-2.0
"""``platform validate RECIPE [overrides...]``: check a recipe, report every problem, run nothing."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="validate a recipe (all problems at once); runs nothing")
    p.add_argument("recipe", help="recipe YAML file")
    p.add_argument("overrides", nargs="*", help="dotlist overrides: key=value, +key=value, ~key")
    p.add_argument("--print", action="store_true", help="print the resolved recipe")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from specmoe.config.load import load_recipe
    from specmoe.config.validate import to_plain

    cfg = load_recipe(args.recipe, args.overrides)
    if args.print:
        print(yaml.safe_dump(to_plain(cfg), sort_keys=False))
    print(f"OK: {args.recipe} is valid ({len(cfg.stages)} stages, {len(cfg.methods)} methods, "
          f"{len(cfg.datasets)} datasets)")
    return 0
