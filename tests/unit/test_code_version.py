# SPDX-License-Identifier: Apache-2.0
"""The code version in cache keys is a hash of the code that computes a result, not of the whole checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import specmoe
from specmoe.config.schema import Component
from specmoe.tracking.environment import code_version, source_hash

SRC = Path(specmoe.__file__).resolve().parent

_PROBE = ("import json, specmoe; from specmoe.tracking.environment import code_version; "
          "assert specmoe.__file__.startswith({root!r}), specmoe.__file__; print(json.dumps(code_version()))")


def _checkout(tmp_path: Path) -> Path:
    """A git checkout holding a copy of the specmoe sources, committed."""
    repo = tmp_path / "repo"
    shutil.copytree(SRC, repo / "platform" / "specmoe", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "recipes").mkdir()
    (repo / "recipes" / "demo.yaml").write_text("name: demo\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", *args], cwd=repo, check=True, env=env, capture_output=True)
    return repo


def _version_in(repo: Path) -> dict:
    root = str(repo / "platform")
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run([sys.executable, "-c", _PROBE.format(root=root)], cwd=repo, env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_files_outside_the_code_change_no_key_and_a_source_edit_does(tmp_path):
    repo = _checkout(tmp_path)
    before = _version_in(repo)
    assert set(before) == {"specmoe", "source"}
    # what a user adds to or a run writes into a checkout: a recipe, a notebook, an MLflow store and its lock,
    # an edited tracked recipe, run directories
    (repo / "recipes" / "mine.yaml").write_text("name: mine\n")
    (repo / "recipes" / "demo.yaml").write_text("name: demo\nedited: true\n")
    (repo / "analysis.ipynb").write_text("{}")
    (repo / "mlflow.db").write_bytes(b"sqlite")
    (repo / "mlflow.db.lock").write_text("{}")
    (repo / "runs" / "x").mkdir(parents=True)
    (repo / "runs" / "x" / "config.yaml").write_text("a: 1\n")
    (repo / "platform" / "specmoe" / "decoding" / "__pycache__").mkdir(exist_ok=True)
    (repo / "platform" / "specmoe" / "decoding" / "__pycache__" / "engine.cpython-311.pyc").write_bytes(b"x")
    assert _version_in(repo) == before
    engine = repo / "platform" / "specmoe" / "decoding" / "engine.py"
    engine.write_text(engine.read_text() + "\n# an edit\n")
    after = _version_in(repo)
    assert after["source"] != before["source"] and after["specmoe"] == before["specmoe"]
    # committing the edit changes nothing more: the key follows the code, not git
    subprocess.run(["git", "commit", "-qam", "edit"], cwd=repo, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})
    assert _version_in(repo) == after


def test_source_hash_covers_every_source_file_by_path_and_content(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("x = 1\n")
    base = source_hash(pkg)
    (pkg / "sub" / "a.py").write_text("x = 2\n")
    assert source_hash(pkg) != base
    (pkg / "sub" / "a.py").write_text("x = 1\n")
    assert source_hash(pkg) == base
    (pkg / "sub" / "a.py").rename(pkg / "sub" / "b.py")
    assert source_hash(pkg) != base  # a renamed module is other code


def test_the_plugins_a_recipe_uses_are_part_of_the_code_version():
    comps = [Component("confidence", {}, "selector"), Component("eagle3", {}, "drafter")]
    code = code_version(comps)
    roots = code["plugins"]
    assert list(roots) == ["specmoe_plugins"]
    import specmoe_plugins

    assert roots["specmoe_plugins"] == source_hash(Path(specmoe_plugins.__file__).resolve().parent)
    assert code_version()["source"] == code["source"]


def test_a_run_refuses_to_start_where_git_tracks_a_file_runs_write(tmp_path, monkeypatch):
    import pytest

    from specmoe.config.load import load_recipe
    from specmoe.errors import UserError
    from specmoe.preflight import preflight

    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: k\n")
    cfg = load_recipe(recipe)
    repo = tmp_path / "clone"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "mlflow.db.lock").write_text("{}")
    (repo / "notes.md").write_text("mine\n")
    monkeypatch.chdir(repo)
    subprocess.run(["git", "add", "notes.md"], cwd=repo, check=True)
    preflight(cfg)  # an untracked lock and a tracked note are fine
    subprocess.run(["git", "add", "mlflow.db.lock"], cwd=repo, check=True)
    with pytest.raises(UserError) as err:
        preflight(cfg)
    text = str(err.value)
    assert "mlflow.db.lock" in text and "git rm --cached" in text and ".gitignore" in text
