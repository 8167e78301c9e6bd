# SPDX-License-Identifier: Apache-2.0
"""Removing any one plugin (a module or a folder under ``plugins/specmoe_plugins/<kind>/``, with its entry points)
leaves every other plugin importable through the registries (issue 24, acceptance). One subprocess
(``tests/fixtures/plugin_removal.py``) walks every plugin: the plugins source root copied without it, the entry
points filtered to the modules that still exist, every registry's plugins imported, every remaining module
imported. A plugin that imports another one is noticed (the second test plants one). The core needs no such
walk: the import contract "the core never imports the built-in plugins" (``lint-imports``) proves it imports
without any of them (its deprecation aliases import a moved module by name only when a name is taken)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "fixtures" / "plugin_removal.py"
PLUGINS = ROOT / "plugins"

#: plugins built on another one through the registry (a subclass of its class; today: GTO is EAGLE-3 with
#: another training objective). Without the one it builds on, its entry points fail with the registry's
#: unknown-name message naming the missing plugin, and nothing else fails.
BUILDS_ON = {"drafters/gto": "drafters/eagle3"}


def _walk(source: Path, work: Path, units: list[str] | None = None, extra: dict | None = None) -> dict:
    cmd = [sys.executable, str(SCRIPT), "--source", str(source), "--work", str(work),
           "--extra-entry-points", json.dumps(extra or {})]
    if units is not None:
        cmd += ["--units", *units]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=work)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _units(source: Path) -> list[str]:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from plugin_removal import plugin_units
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return plugin_units(source)


def test_removing_any_plugin_leaves_every_other_plugin_importable(tmp_path):
    units = _units(PLUGINS)
    assert {"drafters/eagle3", "predictors/learned", "selectors/goodput", "targets/tiny", "targets/hf",
            "verifiers/hf", "datasets/gsm8k", "stages/collect_traces"} <= set(units)
    report = _walk(PLUGINS, tmp_path, ["", *units])

    whole = report.pop("")
    assert whole["errors"] == [] and whole["dropped"] == []
    every = set(whole["entry_points"])
    assert len(every) >= 40 and whole["modules"] >= 70
    for unit, row in report.items():
        assert row["dropped"], f"{unit}: removing it dropped no entry point (is it a plugin?)"
        assert row["modules"] > 0
        errors = list(row["errors"])
        for dependent in [d for d, base in BUILDS_ON.items() if base == unit]:
            own = tuple(f"{ep}:" for ep in report[dependent]["dropped"])
            own += (f"module specmoe_plugins.{dependent.replace('/', '.')}.",)
            theirs = [e for e in errors if e.startswith(own)]
            assert theirs, f"{dependent} builds on {unit} but imported without it"
            gone = [f"'{ep.partition(':')[2]}'" for ep in row["dropped"]]  # the message names what is missing
            assert all("UnknownPluginError" in e and any(g in e for g in gone) for e in theirs), theirs
            errors = [e for e in errors if e not in theirs]
        assert errors == [], f"without {unit}: {errors}"
        lost = every - set(row["entry_points"]) - set(row["dropped"])
        assert all(any(e.startswith(f"{ep}:") for e in row["errors"]) for ep in lost), (unit, lost)


ROGUE = '''
from specmoe.interfaces.selector import Selector
from specmoe_plugins.predictors.oracle import OraclePredictor  # a plugin importing another: forbidden


class Rogue(Selector):
    partner = OraclePredictor

    def select(self, tree, budget, experts=None, buffer=None):
        return tree.valid & (tree.depth == 0)
'''


def test_the_walk_notices_a_plugin_that_imports_another(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(PLUGINS / "specmoe_plugins", source / "specmoe_plugins",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (source / "specmoe_plugins" / "selectors" / "rogue.py").write_text(ROGUE)
    work = tmp_path / "work"
    work.mkdir()
    report = _walk(source, work, ["", "predictors/oracle", "predictors/router_on_embedding"],
                   {"specmoe.selectors": {"rogue": "specmoe_plugins.selectors.rogue:Rogue"}})

    assert report[""]["errors"] == [] and "specmoe.selectors:rogue" in report[""]["entry_points"]
    assert report["predictors/router_on_embedding"]["errors"] == []
    errors = report["predictors/oracle"]["errors"]
    assert any(e.startswith("specmoe.selectors:rogue:") and "oracle" in e for e in errors), errors
    assert any(e.startswith("module specmoe_plugins.selectors.rogue:") for e in errors), errors
    assert all("rogue" in e for e in errors), errors
    assert "specmoe.selectors:rogue" not in report["predictors/oracle"]["entry_points"]
