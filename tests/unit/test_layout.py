# SPDX-License-Identifier: Apache-2.0
"""The source-root layout never shadows the stdlib ``platform`` module; the CLI entry points work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_source_roots_have_no_init():
    assert not (REPO / "platform" / "__init__.py").exists()
    assert not (REPO / "plugins" / "__init__.py").exists()
    assert (REPO / "platform" / "specmoe" / "__init__.py").is_file()
    assert (REPO / "plugins" / "specmoe_plugins" / "__init__.py").is_file()


def test_stdlib_platform_wins_with_repo_root_on_path():
    code = "import sys; sys.path.insert(0, sys.argv[1]); import platform; print(platform.system())"
    out = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in {"Linux", "Darwin", "Windows"}


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["validate", "--help"], ["ls", "--help"],
                                  ["compare", "--help"], ["ui", "--help"], ["bench", "--help"]])
def test_every_subcommand_has_help(argv):
    out = subprocess.run([sys.executable, "-m", "specmoe", *argv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout


def test_console_script_installed():
    exe = Path(sys.executable).parent / "platform"
    out = subprocess.run([str(exe), "ls", "selector"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ecospec" in out.stdout
