# SPDX-License-Identifier: Apache-2.0
"""``platform run RECIPE [overrides...]``: run a recipe's stages and evaluation, log to MLflow."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a recipe (stages are cached; evaluation groups too)",
                       description="Example: platform run recipes/tiny_gsm8k.yaml decoding.budget=6 ~methods.2. "
                       "A failure prints one message naming what failed and where its log is (--debug: the "
                       "traceback); rerunning the same command continues from what finished.")
    p.add_argument("recipe", help="recipe YAML file")
    p.add_argument("overrides", nargs="*", help="dotlist overrides: key=value, +key=value, ~key")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from specmoe.api import run as run_config
    from specmoe.config.load import load_recipe
    from specmoe.data.sources import DATA_DIR_ENV

    cfg = load_recipe(args.recipe, args.overrides)
    if cfg.data_dir:  # child processes (data loader workers, torchrun ranks) see the recipe's data directory
        os.environ[DATA_DIR_ENV] = str(Path(cfg.data_dir).expanduser().resolve())
    result = run_config(cfg)
    if result.run_dir is None:  # a worker rank: rank 0 reports
        return 0
    if result.table:
        print(result.table)
    print(f"run directory: {result.run_dir}")
    if result.tracking_uri:
        print(f"MLflow: {result.tracking_uri} (run {result.run_id}); compare with: platform compare "
              f"--experiment {result.experiment}")
    return 0
