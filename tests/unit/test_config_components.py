# SPDX-License-Identifier: Apache-2.0
"""Typed options all the way down: ``dtype`` options are validated enums in every plugin, and a stage's own
components (its ``target``, its ``dataset`` / ``datasets``) are validated against the named plugin's
``Config``, honour ``name:``, and carry their ``stage:`` references into the stage cache keys."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import pytest
import yaml

from specmoe.config.errors import ConfigError
from specmoe.config.load import load_recipe
from specmoe.config.validate import to_plain
from specmoe.interfaces.options import DType, torch_dtype
from specmoe.registry import stages, targets
from specmoe.stages.options import build_target
from specmoe.stages.runner import StageRunner


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def test_dtype_spellings_validate_everywhere_and_bad_ones_fail(tmp_path):
    good = write(tmp_path / "good.yaml", """
        name: good
        target: {name: hf, tiny: {arch: qwen3_moe}, dtype: bf16}
        methods:
          - {name: e, drafter: {name: eagle3, init: {}, dtype: bf16}, predictor: {name: learned, dtype: float16}}
          - {name: m, drafter: {name: mtp, dtype: fp32}}
        tracking: {enabled: false}
    """)
    cfg = load_recipe(good)
    assert cfg.target.options["dtype"] is DType.bfloat16
    assert cfg.methods[0].drafter.options["dtype"] is DType.bfloat16
    assert cfg.methods[1].drafter.options["dtype"] is DType.float32
    plain = to_plain(cfg)  # the resolved config written to config.yaml and MLflow: plain canonical names
    assert plain["target"]["dtype"] == "bfloat16" and plain["methods"][0]["predictor"]["dtype"] == "float16"
    assert yaml.safe_load(yaml.safe_dump(plain))["methods"][1]["drafter"]["dtype"] == "float32"

    bad = write(tmp_path / "bad.yaml", """
        name: bad
        target: {name: hf, tiny: {arch: qwen3_moe}, dtype: bf17}
        methods:
          - {name: e, drafter: {name: eagle3, init: {}, dtype: half}}
        tracking: {enabled: false}
    """)
    with pytest.raises(ConfigError) as err:
        load_recipe(bad)
    text = err.value.report()
    assert "target.dtype: must be one of float32, bfloat16, float16 (or fp32, bf16, fp16), got str 'bf17'" in text
    assert "methods.0.drafter.dtype: must be one of float32, bfloat16, float16" in text
    assert "KeyError" not in text and "Traceback" not in text
    with pytest.raises(ValueError, match="drafter eagle3.dtype 'half' is not one of float32"):
        torch_dtype("half", where="drafter eagle3.dtype")


RECIPE = """
    name: stages
    stages:
      - {id: target, name: pretrain_target}
      - id: responses
        name: generate_responses
        target: {path: "stage:target", dtype: bfloat16}
        dataset: {name: gsm8k, split: train, limit: 4}
      - id: traces
        name: collect_traces
        target: {name: hf, path: "stage:target"}
        datasets: [{name: gsm8k, split: train, limit: 2}, {name: humaneval, limit: 2}]
      - {id: mtp, name: train_mtp, responses: "stage:responses"}
    tracking: {enabled: false}
"""


def test_stage_components_are_validated(tmp_path):
    cfg = load_recipe(write(tmp_path / "ok.yaml", RECIPE))
    resp = cfg.stages[1].component.options
    assert resp["target"].name == "hf" and resp["target"].options["dtype"] is DType.bfloat16  # name: defaults
    assert resp["dataset"].name == "gsm8k" and resp["dataset"].options["limit"] == 4
    assert [d.name for d in cfg.stages[2].component.options["datasets"]] == ["gsm8k", "humaneval"]
    assert cfg.stages[3].component.options["target"].options == {"path": "stage:target"}  # the field default

    bad = RECIPE.replace('dtype: bfloat16}', 'dtype: bf17, devise: cpu}').replace(
        "name: hf, path", "name: hff, path").replace("{name: humaneval, limit: 2}", "{name: humaneval, limt: 2}")
    with pytest.raises(ConfigError) as err:
        load_recipe(write(tmp_path / "bad.yaml", bad))
    text = err.value.report()
    assert "stages.1.target.dtype: must be one of float32" in text
    assert "stages.1.target.devise: unknown key. Did you mean 'device'?" in text
    assert "stages.2.target.name: unknown target 'hff'. Did you mean 'hf'?" in text
    assert "stages.2.datasets.1.limt: unknown key. Did you mean 'limit'?" in text


def test_stage_references_inside_components_order_and_key_the_stages(tmp_path):
    cfg = load_recipe(write(tmp_path / "ok.yaml", RECIPE))
    runner = StageRunner(cfg.stages, tmp_path / "cache")
    assert runner.order.index("target") < min(runner.order.index(s) for s in ("responses", "traces", "mtp"))
    resolved = runner.resolve(cfg.stages[1].component.options)
    assert resolved["target"].options["path"] == str(runner.out_dir("target"))
    edited = load_recipe(write(tmp_path / "edited.yaml", RECIPE.replace("limit: 4", "limit: 5")))
    keys = StageRunner(edited.stages, tmp_path / "cache").keys
    assert keys["responses"] != runner.keys["responses"] and keys["target"] == runner.keys["target"]


def test_stage_target_honours_name(make_target, tiny_cache):
    hf = targets.get("hf")

    class Renamed(hf):
        description = "the hf target under another name (test)"

    targets.register("renamed_target_for_test", Renamed)
    try:
        stage = stages.get("collect_traces")
        cfg = stage.Config(target={"name": "renamed_target_for_test", "tiny": {"arch": "qwen3_moe"},
                                   "cache_dir": str(tiny_cache)})
        built = build_target(cfg, device="cpu")
        assert type(built) is Renamed and built.device.type == "cpu"
        default = build_target(stage.Config(target={"tiny": {"arch": "qwen3_moe"}, "cache_dir": str(tiny_cache)}))
        assert type(default) is hf  # no name: the field's name_default
    finally:
        targets.unregister("renamed_target_for_test")


@dataclass
class _NoComponents:
    target: dict


def test_a_stage_option_without_a_name_is_a_clear_error():
    from specmoe.errors import UserError

    with pytest.raises(UserError, match=r"_NoComponents.target: a target needs 'name'"):
        build_target(_NoComponents(target={"path": "x"}))
