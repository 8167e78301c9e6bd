# SPDX-License-Identifier: Apache-2.0
"""The import-cycle contract of ``pyproject.toml`` (``acyclic_siblings``) catches a cycle, an annotation's too.

``.ci/run`` runs ``lint-imports`` on the tree as it is; this test runs the same contract on a copy of the source
roots with one planted loop (``decoding/inputs.py`` importing the engine that imports it, under
``if TYPE_CHECKING:``, the way a precise annotation would) and checks that it breaks there and holds on the
unchanged copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _cycle_contract() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: import-linter reads pyproject.toml with tomli there
        import tomli as tomllib
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in cfg["contracts"] if c["type"] == "acyclic_siblings"]
    return {"root_packages": cfg["root_packages"], "contract": contract}


def _lint(tmp: Path) -> subprocess.CompletedProcess:
    spec = _cycle_contract()
    c = spec["contract"]
    lines = ["[importlinter]", "root_packages =", *(f"    {p}" for p in spec["root_packages"]), "",
             "[importlinter:contract:cycles]", f"name = {c['name']}", f"type = {c['type']}", "ancestors =",
             *(f"    {a}" for a in c["ancestors"])]
    (tmp / "cycles.ini").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp / "platform"), str(tmp / "plugins")])}
    return subprocess.run([str(LINT), "--no-cache", str(tmp / "cycles.ini")], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (the dev extra)")
def test_the_cycle_contract_breaks_on_a_planted_loop_and_holds_without_it(tmp_path):
    for root in ("platform", "plugins"):
        shutil.copytree(ROOT / root, tmp_path / root, ignore=shutil.ignore_patterns("__pycache__"))
    clean = _lint(tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr

    inputs = tmp_path / "platform" / "specmoe" / "decoding" / "inputs.py"
    text = inputs.read_text()
    anchor = "from specmoe.errors import UserError\n"
    assert anchor in text
    inputs.write_text(text.replace(anchor, anchor + "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                                    "    from specmoe.decoding.engine import SpeculativeEngine  "
                                                    "# noqa: F401\n", 1))
    planted = _lint(tmp_path)
    assert planted.returncode != 0, planted.stdout
    assert "No cycles are allowed in specmoe.decoding" in planted.stdout, planted.stdout
