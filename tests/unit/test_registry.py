# SPDX-License-Identifier: Apache-2.0
"""The plugin registry: decorators, lazy strings, entry points, checks and errors."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest

from specmoe.interfaces.selector import Selector
from specmoe.registry import KINDS, DuplicatePluginError, Registry, RegistryError, UnknownPluginError, selectors


class _Mine(Selector):
    @dataclass
    class Config:
        alpha: float = 1.0

    def select(self, tree, budget, experts=None, buffer=None):
        return tree.valid.clone()


@pytest.fixture
def reg():
    return Registry("selector", Selector, group="specmoe.test_nonexistent_group")


def test_decorator_and_lazy_string(reg):
    reg.register("My-Sel")(_Mine)
    assert reg.get("my_sel") is _Mine  # names are normalised
    reg.register("lazy", target=f"{__name__}:_Mine")
    assert reg.get("lazy") is _Mine
    assert reg.names() == ["lazy", "my_sel"]
    assert "decorator" in reg.origin("my_sel")


def test_duplicate_names_both_origins(reg):
    reg.register("x", target="pkg_a.mod:A", origin="distribution a")
    reg.register("x", target="pkg_a.mod:A", origin="distribution a again")  # same target: harmless
    with pytest.raises(DuplicatePluginError, match=r"pkg_a\.mod:A \(from distribution a\).*pkg_b\.mod:B "
                                                   r"\(from distribution b\)"):
        reg.register("x", target="pkg_b.mod:B", origin="distribution b")


def test_unknown_name_did_you_mean(reg):
    reg.register("ecospec", target=f"{__name__}:_Mine")
    with pytest.raises(UnknownPluginError, match="Did you mean 'ecospec'.*Available: ecospec"):
        reg.get("ecospek")


def test_base_class_check(reg):
    reg.register("bad", target="collections:OrderedDict")
    with pytest.raises(RegistryError, match="does not subclass specmoe.interfaces.selector.Selector"):
        reg.get("bad")


def test_import_path_name(reg):
    assert reg.get(f"{__name__}:_Mine") is _Mine


def test_builtin_entry_points_resolve():
    """Every built-in plugin declared in pyproject.toml imports and subclasses its interface."""
    for kind, registry in KINDS.items():
        for name, target, origin in registry.entries():
            if "entry point" in origin and target.startswith("specmoe_plugins."):
                cls = registry.get(name)
                assert issubclass(cls, registry.base), (kind, name)
                assert hasattr(cls, "Config"), (kind, name)


def test_expected_builtins_are_registered():
    assert {"confidence", "ecospec", "global_cost"} <= set(selectors.names())
    assert {"hf"} <= set(KINDS["target"].names())
    assert {"oracle", "router_on_embedding"} <= set(KINDS["predictor"].names())


def test_importing_specmoe_and_listing_is_light():
    """`import specmoe`, the registries and `platform ls` import no torch/transformers/plugin body."""
    code = textwrap.dedent("""
        import sys
        import specmoe, specmoe.registry
        from specmoe.cli.main import main
        main(["ls"])
        heavy = [m for m in ("torch", "transformers", "mlflow", "triton", "lightning",
                           "specmoe_plugins.selectors.ecospec") if m in sys.modules]
        print("HEAVY", heavy)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout[-500:]


def test_third_party_entry_point_discovered(monkeypatch, tmp_path):
    """A fake installed distribution declaring a selector in group specmoe.selectors is found lazily."""
    mod = tmp_path / "third_party_sel.py"
    mod.write_text(textwrap.dedent("""
        from dataclasses import dataclass
        from specmoe.interfaces.selector import Selector
        class Greedy(Selector):
            @dataclass
            class Config:
                k: int = 1
            def select(self, tree, budget, experts=None, buffer=None):
                return tree.valid & (tree.depth == 0)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint("root_only", "third_party_sel:Greedy", "specmoe.selectors")
    real = importlib.metadata.entry_points

    def fake(**kw):
        if kw.get("group") == "specmoe.selectors":
            return list(real(**kw)) + [ep]
        return real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    reg = Registry("selector", Selector)
    assert "root_only" in reg.names()
    assert "third_party_sel" not in sys.modules  # lazy until requested
    assert reg.get("root_only").__name__ == "Greedy"


def test_defaults_come_from_the_defaults_group():
    """The defaults a recipe or a command takes where it names no plugin are the built-ins of before (the recipe's
    selector / verifier, the benches' components), declared in pyproject.toml's ``specmoe.defaults``."""
    reg = {kind: KINDS[kind] for kind in ("target", "drafter", "selector", "predictor", "verifier", "dataset")}
    assert [reg[k].default() for k in reg] == ["hf", "eagle3", "confidence", "router_on_embedding", "hf", "gsm8k"]
    assert (selectors.default("experts"), reg["verifier"].default("union"), reg["verifier"].default("cuda")) == \
        ("ecospec", "torch_union", "triton_union")
    with pytest.raises(RegistryError, match=r"no default stage is declared.*name one: .*train_eagle3"):
        KINDS["stage"].default()
    assert KINDS["verifier"].defaults() == {"": "hf", "union": "torch_union", "cuda": "triton_union"}
    assert KINDS["stage"].defaults() == {}


def test_a_default_declared_twice_or_unregistered_is_reported(monkeypatch):
    real = importlib.metadata.entry_points
    extra: list = []

    def fake(**kw):
        return list(real(**kw)) + (extra if kw.get("group") == "specmoe.defaults" else [])

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    extra[:] = [importlib.metadata.EntryPoint("selector", "elsewhere:Other", "specmoe.defaults")]
    with pytest.raises(RegistryError, match=r"default selector is declared more than once.*elsewhere:Other"):
        selectors.default()
    extra[:] = [importlib.metadata.EntryPoint("selector.odd", "elsewhere:Other", "specmoe.defaults")]
    with pytest.raises(RegistryError, match=r"default selector \(odd\) is declared as 'elsewhere:Other', which no "
                                            r"registered selector is; registered: .*confidence"):
        selectors.default("odd")


def test_a_method_without_selector_or_verifier_takes_the_defaults():
    from specmoe.config.schema import MethodConfig

    m = MethodConfig(name="m")
    assert (m.selector.name, m.selector.kind, m.verifier.name, m.verifier.kind) == \
        ("confidence", "selector", "hf", "verifier")


def test_ls_marks_the_defaults(capsys):
    from specmoe.cli.main import main

    assert main(["ls", "selector"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["confidence"].endswith("(default)") and rows["ecospec"].endswith("(default experts)")
    assert "default" not in rows["global_cost"].rpartition("]")[2]
