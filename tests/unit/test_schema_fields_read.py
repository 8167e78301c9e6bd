# SPDX-License-Identifier: Apache-2.0
"""Every field of the recipe schema is read by something (no dead options): a whole `platform run` of a small
recipe records which fields code reads, leaving out the generic walkers (validation, plain-dict dumps,
dataclass helpers), which read every field whether it matters or not."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from pathlib import Path

import pytest

from specmoe.config import schema

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
SCHEMA = [schema.RunConfig, schema.DecodingConfig, schema.MethodConfig, schema.EvalConfig, schema.TrackingConfig,
          schema.RequiresConfig, schema.StageSpec, schema.Component]
#: code that walks every field generically (dumps, hashes, validation): a read there proves nothing
GENERIC = ("dataclasses.py", "copy.py", "<string>", str(Path("specmoe") / "config" / "validate.py"))
#: consumed by the loader from the raw mapping, before the typed config exists (checked below)
LOAD_TIME = {("RunConfig", "imports"), ("RunConfig", "variables")}


@pytest.fixture
def reads(monkeypatch):
    seen: set[tuple[str, str]] = set()
    for cls in SCHEMA:
        names = {f.name for f in dataclasses.fields(cls)}

        def spy(self, name, _names=names, _cls=cls):
            if name in _names:
                caller = sys._getframe(1).f_code.co_filename
                if not caller.endswith(GENERIC):
                    seen.add((_cls.__name__, name))
            return object.__getattribute__(self, name)

        monkeypatch.setattr(cls, "__getattribute__", spy, raising=False)
    return seen


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from specmoe_plugins.targets.tiny.tokenizer import train_bpe_tokenizer

    lines = [json.loads(x) for x in (DATA / "gsm8k" / "train.jsonl").read_text().splitlines()[:100]]
    out = tmp_path_factory.mktemp("tok")
    train_bpe_tokenizer((r["question"] + "\n" + r["answer"] for r in lines), vocab_size=300).save_pretrained(out)
    return out


def test_every_schema_field_is_read(tmp_path, tokenizer_dir, reads, monkeypatch):
    from specmoe.api import run
    from specmoe.config.load import load_recipe

    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "all.yaml"
    recipe.write_text(textwrap.dedent(f"""
        name: all_fields
        description: every schema field in one small run
        imports: [fixtures.stages]
        variables: {{new_tokens: 4}}
        output_dir: {tmp_path}/runs
        cache_dir: {tmp_path}/cache
        data_dir: {DATA}
        requires: {{cuda_devices: 0, gpu_memory_gb: 0}}
        stages:
          - {{id: s, name: test_controlled, control: {tmp_path}/s.json, label: s}}
        target: {{name: hf, tiny: {{arch: qwen3_moe, vocab_size: 300}}, tokenizer: {tokenizer_dir},
                  cache_dir: {tmp_path}/tiny}}
        datasets: [{{name: gsm8k, limit: 1, num_shots: 0}}]
        decoding: {{budget: 3, steps: 2, top_k: 2, max_new_tokens: "${{variables.new_tokens}}",
                    stop_strings: ["Question:"], ignore_eos: true}}
        methods:
          - {{name: ar}}
          - {{name: eco, drafter: {{name: draft_model, share_target: true}}, selector: ecospec,
             predictor: router_on_embedding, verifier: hf, analysis_only: false}}
        eval: {{temperatures: [0.0], budgets: [], batch_sizes: [1], warmup: 0, seed: 1}}
        tracking: {{enabled: true, uri: "sqlite:///{tmp_path}/mlflow.db", experiment: fields,
                    artifact_location: {tmp_path}/artifacts}}
    """))
    cfg = load_recipe(recipe)
    assert cfg.decoding.max_new_tokens == 4  # variables: consumed by interpolation at load time
    from specmoe.registry import stages

    assert "test_controlled" in stages.names()  # imports: consumed (imported) at load time
    result = run(cfg)
    assert len(result.cells) == 2
    declared = {(cls.__name__, f.name) for cls in SCHEMA for f in dataclasses.fields(cls)}
    unread = sorted(declared - reads - LOAD_TIME)
    assert unread == [], f"schema fields nothing reads (remove them or make them work): {unread}"


def test_removed_options_say_what_replaces_them(tmp_path):
    from specmoe.config.errors import ConfigError
    from specmoe.config.load import load_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nseed: 3\ndecoding: {temperature: 1.0, batch_size: 4}\n")
    with pytest.raises(ConfigError) as err:
        load_recipe(recipe)
    text = str(err.value)
    assert "decoding.temperature: this key was removed: set the temperatures of the evaluation grid with " \
           "eval.temperatures" in text
    assert "decoding.batch_size: this key was removed" in text and "eval.batch_sizes" in text
    assert "seed: this key was removed" in text
    recipe.write_text("name: r\nsource: x.yaml\n")
    with pytest.raises(ConfigError, match="source: is set by platform"):
        load_recipe(recipe)
