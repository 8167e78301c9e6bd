# SPDX-License-Identifier: Apache-2.0
"""``platform bench``: core benchmarks and those a plugin declares in the entry-point group ``specmoe.benches``."""

from __future__ import annotations

import logging

import pytest
from fixtures.dists import fake_distribution

from specmoe.cli.main import main
from specmoe.registry import RegistryError, benches, registry_for

_BENCH = '''
    """Lab bench: prints what it was asked."""
    def add_arguments(p):
        p.add_argument("--n", type=int, default=3)
    def run(args):
        print("LAB BENCH RAN", args.n)
        return 0
'''


@pytest.fixture
def lab_site(tmp_path, monkeypatch):
    site = fake_distribution(tmp_path / "site", "lab-bench", "0.1", "lab_bench",
                             {"specmoe.benches": {"lab": "lab_bench", "lab_broken": "lab_bench_missing"}},
                             code=_BENCH)
    (site / "lab_bad.py").write_text("def run(args):\n    return 0\n")
    monkeypatch.syspath_prepend(str(site))
    benches._clear()
    yield site
    benches._clear()


def test_plugin_bench_is_listed_and_runs(lab_site, capsys, caplog):
    with caplog.at_level(logging.WARNING):
        with pytest.raises(SystemExit):
            main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "lab" in out and "Lab bench: prints what it was asked." in out and "[lab_bench]" in out
    for name in ("engine", "tree", "selector"):  # the built-in ones (entry points too) stay listed beside it
        assert name in out
    # a plugin bench that cannot be imported is left out with one warning naming it; the CLI still works
    assert any("lab_broken" in r.getMessage() and "lab_bench_missing" in r.getMessage() for r in caplog.records)
    assert main(["bench", "lab", "--n", "7"]) == 0
    assert "LAB BENCH RAN 7" in capsys.readouterr().out
    assert "lab" in benches.names() and benches.distribution("lab") == ("lab-bench", "0.1")
    assert registry_for("benches") is benches and registry_for("bench") is benches


def test_unknown_bench_lists_core_and_plugins(lab_site, capsys):
    with pytest.raises(SystemExit) as err:
        main(["bench", "goodputt"])
    assert err.value.code == 2
    msg = capsys.readouterr().err
    assert "unknown bench 'goodputt'" in msg and "Did you mean 'goodput'" in msg
    assert "lab," in msg or "lab " in msg
    assert "Traceback" not in msg


def test_bench_module_without_its_functions_is_refused(lab_site):
    benches.register("lab_bad", target="lab_bad")
    with pytest.raises(RegistryError, match="lab_bad.*does not define add_arguments"):
        benches.get("lab_bad")
