# SPDX-License-Identifier: Apache-2.0
"""Recipe loading: base composition, overrides, interpolation, typed plugin configs, error reporting."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specmoe.config.errors import ConfigError
from specmoe.config.load import load_recipe

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def recipe(tmp_path):
    write(tmp_path / "_base" / "common.yaml", """
        variables: {gamma: 4}
        decoding: {budget: "${variables.gamma}", steps: 3, top_k: 2}
        target: {name: hf, tiny: {arch: qwen3_moe}}
        methods:
          - {name: ar}
          - {name: eagle, drafter: {name: draft_model, share_target: true}, selector: confidence}
          - {name: eco, drafter: {name: draft_model, share_target: true}, selector: {name: ecospec, eps: 1.0e-6},
             predictor: router_on_embedding}
        tracking: {enabled: false}
    """)
    return write(tmp_path / "exp.yaml", """
        base: common.yaml
        name: exp
        decoding: {max_new_tokens: 32}
    """)


def test_base_merge_interpolation_and_typed_plugins(recipe):
    cfg = load_recipe(recipe)
    assert cfg.name == "exp"
    assert cfg.decoding.budget == 4 and cfg.decoding.max_new_tokens == 32 and cfg.decoding.steps == 3
    eco = cfg.methods[2]
    assert eco.selector.name == "ecospec" and eco.selector.options == {"eps": 1e-6, "shared_buffer": False,
                                                                                 "calibrated": True}
    assert eco.predictor.name == "router_on_embedding"
    assert cfg.methods[0].drafter is None and cfg.methods[0].verifier.name == "hf"
    assert cfg.target.options["tiny"] == {"arch": "qwen3_moe"}


def test_overrides_set_delete_and_revalidate(recipe):
    cfg = load_recipe(recipe, ["decoding.budget=6", "~methods.2", "methods.1.selector.name=ecospec",
                               "+eval.temperatures=[0.0,1.0]"])
    assert cfg.decoding.budget == 6
    assert [m.name for m in cfg.methods] == ["ar", "eagle"]
    assert cfg.methods[1].selector.name == "ecospec"
    assert cfg.eval.temperatures == [0.0, 1.0]
    with pytest.raises(ConfigError) as err:  # a stale kwarg that the new plugin does not take
        load_recipe(recipe, ["methods.2.selector.name=confidence"])
    assert "methods.2.selector.eps: unknown key" in str(err.value)


def test_all_problems_at_once(recipe, tmp_path):
    bad = write(tmp_path / "bad.yaml", """
        base: common.yaml
        name: bad
        decoding: {budgt: 5, steps: three}
        methods:
          - {name: x, drafter: {name: draft_modle}, selector: ecospek}
    """)
    with pytest.raises(ConfigError) as err:
        load_recipe(bad)
    msgs = [str(p) for p in err.value.problems]
    text = "\n".join(msgs)
    assert len(msgs) == 4, text
    assert f"{bad}: decoding.budgt: unknown key. Did you mean 'budget'?" in text
    assert "decoding.steps: expected int, got str 'three'" in text
    assert "methods.0.drafter.name: unknown drafter 'draft_modle'. Did you mean 'draft_model'?" in text
    assert "methods.0.selector: unknown selector 'ecospek'. Did you mean 'ecospec'?" in text


def test_override_origin_is_named(recipe):
    with pytest.raises(ConfigError) as err:
        load_recipe(recipe, ["decoding.bugdet=3"])
    assert "command-line override 'decoding.bugdet=3': decoding.bugdet: unknown key" in str(err.value)


def test_yaml_syntax_error_and_missing_files(tmp_path):
    broken = write(tmp_path / "broken.yaml", "name: x\ndecoding: {budget: 4\n")
    with pytest.raises(ConfigError, match=r"broken.yaml:\d+:\d+: YAML syntax error"):
        load_recipe(broken)
    with pytest.raises(ConfigError, match="nope.yaml: file not found"):
        load_recipe(tmp_path / "nope.yaml")
    nobase = write(tmp_path / "nobase.yaml", "base: missing.yaml\nname: x\n")
    with pytest.raises(ConfigError, match="base: base recipe 'missing.yaml' not found"):
        load_recipe(nobase)


def test_stage_references_checked(tmp_path):
    r = write(tmp_path / "s.yaml", """
        name: s
        stages:
          - {id: target, name: pretrain_target}
        target: {name: hf, path: "stage:targte"}
    """)
    with pytest.raises(ConfigError, match="refers to unknown stage 'targte'. Did you mean 'stage:target'"):
        load_recipe(r)


def test_validate_cli_reports_without_traceback(recipe, tmp_path):
    bad = write(tmp_path / "bad2.yaml", """
        base: common.yaml
        name: bad2
        decoding: {budgt: 5}
        target: {name: hff}
    """)
    out = subprocess.run([sys.executable, "-m", "specmoe", "validate", str(bad)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "2 problems in the recipe" in out.stderr
    assert "unknown target 'hff'. Did you mean 'hf'?" in out.stderr
    ok = subprocess.run([sys.executable, "-m", "specmoe", "validate", str(recipe)], capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0 and "is valid" in ok.stdout


def test_every_shipped_recipe_validates():
    recipes = sorted(p for p in (REPO / "recipes").rglob("*.yaml") if "_base" not in p.parts)
    assert recipes, "recipes/ should ship recipes"
    problems = []
    for path in recipes:
        try:
            load_recipe(path)
        except ConfigError as exc:
            problems.append(exc.report())
    assert not problems, "\n".join(problems)


def test_prompts_for_margin_and_max_prompts_are_checked_before_any_work():
    from pathlib import Path

    from specmoe.config.errors import ConfigError
    from specmoe.config.load import load_recipe

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "tiny_gsm8k.yaml"
    with pytest.raises(ConfigError) as err:
        load_recipe(recipe, ["eval.prompts_for_margin=2", "eval.max_prompts=0"], check_plugins=False)
    text = str(err.value)
    assert "eval.prompts_for_margin" in text and "(0, 1)" in text and "eval.max_prompts" in text
    assert load_recipe(recipe, ["eval.prompts_for_margin=0.05"], check_plugins=False).eval.prompts_for_margin == 0.05


def test_layers_and_overrides_keep_their_plain_semantics(tmp_path):
    """What ``OmegaConf.merge`` / ``from_dotlist`` would do otherwise (``specmoe.config.load``'s docstring): a later
    layer's list replaces a base mapping and its ``???`` replaces a value; an override's numeric part indexes (and
    appends to) a list, ``1e-3`` stays YAML's string, and a component name becomes a mapping when a key is set in
    it; each key keeps the file or override that set it."""
    from specmoe.config.load import _Origins, apply_overrides, load_layers

    write(tmp_path / "base.yaml", "a: {x: 1}\nb: 2\nm: [{name: ar}, {name: e, selector: ecospec}]\n")
    top = write(tmp_path / "top.yaml", "base: base.yaml\na: [1, 2]\nb: '???'\n")
    problems: list = []
    origins = _Origins(str(top))
    merged = load_layers(top, problems, origins)
    assert problems == [] and merged == {"a": [1, 2], "b": "???", "m": [{"name": "ar"}, {"name": "e",
                                                                                       "selector": "ecospec"}]}
    assert origins.of("a.0") == str(top) and origins.of("m.1.selector") == str(tmp_path / "base.yaml")
    out = apply_overrides(merged, ["m.1.selector.eps=1e-3", "m.2={name: x}", "~a.0", "c.d=on"], problems, origins)
    assert problems == []
    assert out["m"][1]["selector"] == {"name": "ecospec", "eps": "1e-3"} and out["m"][2] == {"name": "x"}
    assert out["a"] == [2] and out["c"] == {"d": True}
    assert origins.of("m.1.selector.eps") == "command-line override 'm.1.selector.eps=1e-3'"
