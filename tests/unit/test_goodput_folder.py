# SPDX-License-Identifier: Apache-2.0
"""goodput is one folder (issue 24.1): the selector, its cost model, the calibration, the ``calibrate_cost`` stage and
its two benchmarks under ``specmoe_plugins/selectors/goodput/``, found through the registry (the core modules that
moved keep deprecation aliases: ``MOVED_INTO_PLUGINS`` of test_plugin_api.py); short units (no function over 80
lines in ``decoding/``, ``selectors/`` and ``evaluation/``)."""

from __future__ import annotations

import ast
import importlib
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDER = "specmoe_plugins.selectors.goodput"

def test_the_other_benches_keep_their_drafter_helper_without_a_warning(recwarn):
    from specmoe.bench import goodput
    from specmoe.bench.drafters import bench_drafter

    assert goodput._drafter is bench_drafter
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]


def test_the_folder_is_reached_through_the_registry():
    from specmoe.registry import benches, selectors, stages

    assert selectors.get("goodput").__module__ == f"{FOLDER}.selector"
    assert stages.get("calibrate_cost").__module__ == f"{FOLDER}.stage"
    assert benches.get("goodput").__name__ == f"{FOLDER}.bench"
    assert benches.get("goodput_cost").__name__ == f"{FOLDER}.cost_bench"
    package = importlib.import_module(FOLDER)  # the package's names load lazily
    assert package.GoodputSelector is selectors.get("goodput")
    assert package.CostModel.__module__ == f"{FOLDER}.cost_model"


def test_no_function_over_80_lines():
    long = []
    for root in ("platform/specmoe/decoding", "plugins/specmoe_plugins/selectors", "platform/specmoe/evaluation"):
        for path in sorted((ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > 80:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split these functions:\n" + "\n".join(long)
