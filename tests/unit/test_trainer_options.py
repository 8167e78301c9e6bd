# SPDX-License-Identifier: Apache-2.0
"""Training-stage options that depend on the machine: precision ``auto`` (and the cache key that records
it), thread counts, and a partial ``trainer:`` mapping in a recipe."""

from __future__ import annotations

import textwrap

import pytest

import specmoe.training.trainer as trainer_mod
from specmoe.training.trainer import (
    TrainerOptions,
    default_num_threads,
    resolve_precision,
    stage_trainer_options,
    trainer_key_facts,
)


@pytest.fixture
def cpu_only(monkeypatch, tmp_path):
    """A machine without a CUDA GPU, on which bf16 measures faster where it is native (an empty decision
    cache, test_precision_auto.py tests the measured decision); returns a setter for the CPU's native-bf16
    probe."""
    import torch

    import specmoe.precision as precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user_cache"))
    monkeypatch.setattr(precision, "measure_training", lambda work: {"32-true": 2.0, "bf16-mixed": 1.0})

    def probe(native: bool) -> None:
        monkeypatch.setattr(trainer_mod, "cpu_has_native_bf16", lambda: native)

    return probe


def test_auto_precision_follows_the_cpu_probe(cpu_only):
    cpu_only(False)
    assert resolve_precision("auto", "cpu") == resolve_precision("auto", "auto") == "32-true"
    cpu_only(True)
    assert resolve_precision("auto", "cpu") == resolve_precision("auto", "auto") == "bf16-mixed"
    assert resolve_precision("32-true", "cpu") == "32-true"  # an explicit value is kept
    assert TrainerOptions().precision == "auto"


def test_native_bf16_probe_reads_torch(monkeypatch):
    """The real probe: true iff torch reports AVX512-BF16 or AMX (x86) on this CPU."""
    import torch

    trainer_mod.cpu_has_native_bf16.cache_clear()
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(trainer_mod.os, "uname", lambda: type("U", (), {"machine": "x86_64"})())
    assert trainer_mod.cpu_has_native_bf16() is False
    trainer_mod.cpu_has_native_bf16.cache_clear()
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    assert trainer_mod.cpu_has_native_bf16() is True
    trainer_mod.cpu_has_native_bf16.cache_clear()


def test_precision_is_part_of_every_training_stage_key(cpu_only, tmp_path):
    """The same recipe gets a different cache key where ``auto`` means fp32 than where it means bf16; an
    explicit precision, and a stage that does not train, keep theirs."""
    from specmoe.config.load import load_recipe
    from specmoe.stages.runner import StageRunner

    recipe = tmp_path / "r.yaml"
    recipe.write_text(textwrap.dedent("""
        name: keys
        stages:
          - {id: target, name: pretrain_target}
          - {id: fixed, name: pretrain_target, trainer: {precision: 32-true}}
          - {id: eagle3, name: train_eagle3, target: {path: "stage:target"}, data: /x}
          - {id: mtp, name: train_mtp, target: {path: "stage:target"}, responses: /x}
          - {id: traces, name: collect_traces, target: {path: "stage:target"}}
          - {id: predictor, name: train_predictor, traces: "stage:traces"}
    """))
    cfg = load_recipe(recipe)
    runs = {}
    for native in (False, True):
        cpu_only(native)
        runs[native] = StageRunner(cfg.stages, tmp_path / "cache")
    fp32, bf16 = runs[False], runs[True]
    for sid in ("target", "eagle3", "mtp", "predictor"):
        assert fp32.facts[sid] == {"precision": "32-true"} and bf16.facts[sid] == {"precision": "bf16-mixed"}
        assert fp32.keys[sid] != bf16.keys[sid], sid
    assert fp32.keys["fixed"] == bf16.keys["fixed"] and fp32.facts["fixed"] == {"precision": "32-true"}
    # collect_traces does not train, but it reads the target: its key follows the target's
    assert fp32.facts["traces"] == {} and fp32.keys["traces"] != bf16.keys["traces"]


def test_guards_and_threads_are_not_part_of_the_key(tmp_path):
    from specmoe.config.load import load_recipe
    from specmoe.stages.runner import StageRunner

    keys = []
    for extra in ("", ", max_time: '00:00:30:00', num_threads: 1"):
        recipe = tmp_path / "r.yaml"
        recipe.write_text(f"name: k\nstages:\n  - {{id: t, name: pretrain_target, trainer: {{max_steps: 5{extra}}}}}\n")
        keys.append(StageRunner(load_recipe(recipe).stages, tmp_path / "cache").keys["t"])
    assert keys[0] == keys[1]


def test_partial_trainer_mapping_keeps_the_stage_defaults(tmp_path):
    """``trainer: {precision: 32-true}`` on the demo's target validates and keeps max_steps, the validation
    interval across epochs (``check_val_every_n_epoch: null``) and the rest."""
    from specmoe.config.load import load_recipe
    from specmoe_plugins.targets.tiny.stage import PretrainTarget

    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: k\nstages:\n  - {id: t, name: pretrain_target, trainer: {precision: 32-true}}\n")
    (spec,) = load_recipe(recipe).stages
    opts = stage_trainer_options(PretrainTarget, spec.component.options)
    default = PretrainTarget().config.trainer
    assert opts.precision == "32-true" and opts.check_val_every_n_epoch is None
    assert (opts.max_steps, opts.val_check_interval) == (default.max_steps, default.val_check_interval)
    # a dict given directly (no recipe validation) merges the same way
    assert stage_trainer_options(PretrainTarget, {"trainer": {"max_steps": 7}}).check_val_every_n_epoch is None
    assert trainer_key_facts(PretrainTarget, {"trainer": {"precision": "16-mixed"}}) == {"precision": "16-mixed"}


def test_threads_are_cores_over_local_processes(monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert default_num_threads(1) == 8 and default_num_threads(2) == 4 and default_num_threads([0, 1, 2]) == 2
    assert default_num_threads("auto") == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun: 4 processes on this node
    assert default_num_threads(1) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert default_num_threads(1) == 1


def test_tiny_target_recipe_shares_the_demo_target():
    """``recipes/tiny_target.yaml`` trains exactly the demo's target stage (one cache entry for both)."""
    from pathlib import Path

    from specmoe.config.load import load_recipe
    from specmoe.stages.runner import StageRunner

    recipes = Path(__file__).resolve().parents[2] / "recipes"
    keys = [StageRunner(load_recipe(recipes / name).stages, "/nonexistent").keys["target"]
            for name in ("tiny_target.yaml", "tiny_gsm8k.yaml")]
    assert keys[0] == keys[1]


#: the stage keys of ``recipes/tiny_gsm8k.yaml`` where ``precision: auto`` resolves to bf16 (a CPU with native
#: bf16, as the demo's): a change that keeps the recipe and the computation keeps these (a stage's key hashes the
#: options the recipe writes, the stage's version and its key facts). Change a value only with a change that
#: means to retrain that stage, and say why in its commit.
DEMO_KEYS = {"target": "1084eb5672dc090c", "responses": "88f4ee60fae3f3ce", "traces": "6b6a4fcc677abec2",
             "eagle3": "a753f68f2b53daff", "predictor": "b59e44bf0530dda6", "token_table": "124035153c80445e",
             "draft_head": "fdb63177525c054b"}


def test_the_demo_recipe_keeps_its_stage_keys(cpu_only):
    from pathlib import Path

    from specmoe.config.load import load_recipe
    from specmoe.stages.runner import StageRunner

    cpu_only(True)
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "tiny_gsm8k.yaml"
    assert StageRunner(load_recipe(recipe).stages, "/nonexistent").keys == DEMO_KEYS


def test_training_stages_share_one_set_of_optimizer_options(tmp_path):
    """``lr``, ``weight_decay`` and ``warmup_steps`` are declared once (``OptimizerOptions``), stay flat keys of
    each training stage in a recipe (validated: a misspelt one is reported), and each stage keeps its own
    defaults."""
    import dataclasses

    from specmoe.config.errors import ConfigError
    from specmoe.config.load import load_recipe
    from specmoe.registry import stages
    from specmoe.training.trainer import OptimizerOptions

    sharing = {n for n in stages.names() if issubclass(stages.get(n).Config, OptimizerOptions)}
    assert {"pretrain_target", "train_predictor", "train_draft_head", "train_mtp", "train_eagle3",
            "train_gto"} <= sharing
    names = [f.name for f in dataclasses.fields(OptimizerOptions)]
    assert names == ["lr", "weight_decay", "warmup_steps"]
    base = {f.name: f.default for f in dataclasses.fields(OptimizerOptions)}
    for n in sharing:  # declared once: a stage re-declares a field only to change its default
        config = stages.get(n).Config
        own = [k for k in vars(config).get("__annotations__", {}) if k in names]
        assert all(getattr(config, k) != base[k] for k in own), (n, own)
    defaults = {n: stages.get(n)().config.optimizer() for n in ("pretrain_target", "train_predictor",
                                                                 "train_draft_head", "train_mtp")}
    assert defaults == {"pretrain_target": {"lr": 2e-3, "weight_decay": 0.1, "warmup_steps": 20},
                        "train_predictor": {"lr": 1e-5, "weight_decay": 0.0, "warmup_steps": 0},
                        "train_draft_head": {"lr": 2e-3, "weight_decay": 0.0, "warmup_steps": 0},
                        "train_mtp": {"lr": 1e-3, "weight_decay": 0.0, "warmup_steps": 20}}
    drafts = {n: stages.get(n).Config(target=None, data="/x").optimizer() for n in ("train_eagle3", "train_gto")}
    assert drafts == {"train_eagle3": {"lr": 1e-4, "weight_decay": 0.0, "warmup_steps": 0},
                      "train_gto": {"lr": 5e-6, "weight_decay": 0.0, "warmup_steps": 0}}

    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: k\nstages:\n  - {id: p, name: train_predictor, traces: /x, lr: 0.5, warmup_steps: 3}\n")
    (spec,) = load_recipe(recipe).stages
    assert stages.get("train_predictor")(**spec.component.options).config.optimizer() == {
        "lr": 0.5, "weight_decay": 0.0, "warmup_steps": 3}
    recipe.write_text("name: k\nstages:\n  - {id: p, name: train_predictor, traces: /x, warmup_step: 3}\n")
    with pytest.raises(ConfigError, match="warmup_step"):
        load_recipe(recipe)


def test_training_stages_keep_their_stage_keys_on_the_shared_options(tmp_path):
    """train_mtp, train_eagle3 and train_gto took lr / weight_decay / warmup_steps from ``OptimizerOptions`` (the
    same names and defaults): the same cache keys as before (each computed at the commit before its change), with and
    without the options set."""
    from specmoe.config.load import load_recipe
    from specmoe.stages.runner import StageRunner

    recipe = tmp_path / "r.yaml"
    recipe.write_text(textwrap.dedent("""
        name: keys
        stages:
          - {id: target, name: pretrain_target, trainer: {precision: 32-true}}
          - {id: mtp, name: train_mtp, target: {path: "stage:target"}, responses: /x, trainer: {precision: 32-true}}
          - {id: mtp2, name: train_mtp, target: {path: "stage:target"}, responses: /x, lr: 0.5, warmup_steps: 3,
             trainer: {precision: 32-true}}
          - {id: e3, name: train_eagle3, target: {path: "stage:target"}, data: /x, trainer: {precision: 32-true}}
          - {id: e3b, name: train_eagle3, target: {path: "stage:target"}, data: /x, lr: 0.5, warmup_steps: 3,
             weight_decay: 0.1, trainer: {precision: 32-true}}
          - {id: gto, name: train_gto, target: {path: "stage:target"}, data: /x, drafter: "stage:e3",
             trainer: {precision: 32-true}}
          - {id: gto2, name: train_gto, target: {path: "stage:target"}, data: /x, drafter: "stage:e3", lr: 0.25,
             warmup_steps: 2, trainer: {precision: 32-true}}
    """))
    keys = StageRunner(load_recipe(recipe).stages, tmp_path / "cache").keys
    assert keys == {"target": "f0c18bf7cc3955bf", "mtp": "2ea60f2d0817a419", "mtp2": "b77faedde6c7a533",
                    "e3": "08cc489afb78a333", "e3b": "00cc88d8a1baa63f", "gto": "9a73a7a94a1635dd",
                    "gto2": "ed6b101259427925"}
