# SPDX-License-Identifier: Apache-2.0
"""``platform run RECIPE [overrides...]``: run a recipe's stages and evaluation, log to MLflow."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a recipe (stages are cached; evaluation cells too)",
                       description="Example: platform run recipes/tiny_gsm8k.yaml decoding.budget=6 ~methods.2")
    p.add_argument("recipe", help="recipe YAML file")
    p.add_argument("overrides", nargs="*", help="dotlist overrides: key=value, +key=value, ~key")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specmoe.api import run_recipe

    run_recipe(args.recipe, args.overrides)
    return 0
