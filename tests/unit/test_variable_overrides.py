# SPDX-License-Identifier: Apache-2.0
"""A command-line override of a ``variables.*`` key that nothing in the recipe uses is an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from specmoe.config.errors import ConfigError
from specmoe.config.load import load_recipe, used_variables

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_an_override_of_a_variable_the_recipe_never_references_names_the_key_and_what_is_used():
    with pytest.raises(ConfigError) as err:
        load_recipe(RECIPES / "tiny_target.yaml", ["variables.target_steps=8", "variables.precision=32-true"],
                    check_plugins=False)
    text = str(err.value)
    assert "variables.target_steps" in text and "variables.precision" in text
    assert "change nothing" in text and "stages.0.trainer.max_steps" in text


def test_variables_used_directly_or_through_other_variables_may_be_overridden():
    cfg = load_recipe(RECIPES / "tiny_gsm8k.yaml", ["variables.target_steps=8", "variables.precision=32-true",
                                                    "variables.prompts=2"], check_plugins=False)
    target = next(s for s in cfg.stages if s.id == "target")
    assert target.component.options["trainer"]["max_steps"] == 8  # via variables.stage.target
    assert cfg.datasets[0].options["limit"] == 2


def test_unused_definitions_in_files_stay_fine_and_the_message_lists_the_used_ones(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: v\nvariables: {n: 3, unused: 1, nested: {a: '${variables.n}'}}\n"
                      "description: 'n=${variables.nested.a}'\n")
    cfg = load_recipe(recipe, check_plugins=False)  # 'unused' defined, never referenced: fine
    assert cfg.description == "n=3"
    load_recipe(recipe, ["variables.n=4"], check_plugins=False)  # used through variables.nested.a
    load_recipe(recipe, ["variables.nested.a=5"], check_plugins=False)
    with pytest.raises(ConfigError) as err:
        load_recipe(recipe, ["variables.unused=2"], check_plugins=False)
    assert "uses: variables.n, variables.nested.a." in str(err.value)
    assert used_variables({"variables": {"a": {"b": "${variables.c}"}, "c": 1}, "x": "${variables.a}"}) == {"a", "c"}
