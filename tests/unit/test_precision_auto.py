# SPDX-License-Identifier: Apache-2.0
"""``precision: auto`` on a CPU: the faster precision for the work, measured once per machine identity and read
from the user cache afterwards; an explicit precision is never replaced."""

from __future__ import annotations

import json

import pytest

import specmoe.precision as precision
import specmoe.training.trainer as trainer_mod
from specmoe.training.trainer import resolve_precision, trainer_key_facts


@pytest.fixture
def native_cpu(monkeypatch, tmp_path):
    """A CPU-only machine with native bf16 and an empty user cache; returns the list of measured works."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(trainer_mod, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls: list[str] = []
    times = {"32-true": 2.11, "bf16-mixed": 3.10}  # issue 23's Sapphire Rapids: bf16-mixed slower

    def measured(work: str) -> dict[str, float]:
        calls.append(work)
        return dict(times)

    monkeypatch.setattr(precision, "measure_training", measured)
    return calls, times


def test_auto_measures_once_and_reads_the_decision_afterwards(native_cpu, tmp_path):
    calls, _ = native_cpu
    assert resolve_precision("auto", "cpu") == "32-true"  # native bf16, but measured slower
    assert calls == ["train_moe_lm"]
    path = precision.decision_path("train_moe_lm")
    assert path.is_file() and path.is_relative_to(tmp_path / "specmoe" / "precision")
    record = json.loads(path.read_text())
    assert record["decision"] == "32-true" and record["identity"] == precision.cpu_identity()
    for _ in range(3):  # later calls (and stage keys) read the file: no new measurement
        assert resolve_precision("auto", "auto") == "32-true"
    from specmoe_plugins.targets.tiny.stage import PretrainTarget

    assert trainer_key_facts(PretrainTarget, {}) == {"precision": "32-true"}
    assert calls == ["train_moe_lm"]


def test_the_decision_file_is_what_counts(native_cpu):
    """A decision written on this machine is used as it is (bf16 here although the measurement would say
    fp32): the key of a cached stage never flips because a re-measurement came out differently."""
    calls, _ = native_cpu
    path = precision.decision_path("train_moe_lm")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"decision": "bf16-mixed"}))
    assert resolve_precision("auto", "cpu") == "bf16-mixed" and calls == []
    path.write_text("not json")  # a damaged file is measured again and rewritten
    assert resolve_precision("auto", "cpu") == "32-true" and calls == ["train_moe_lm"]
    assert json.loads(path.read_text())["decision"] == "32-true"


def test_bf16_when_it_measures_faster_by_the_margin(native_cpu):
    calls, times = native_cpu
    times.update({"32-true": 2.0, "bf16-mixed": 1.0})
    assert resolve_precision("auto", "cpu") == "bf16-mixed"
    times.update({"32-true": 2.0, "bf16-mixed": 0.95 * 2.0})  # within the margin: float32
    precision.decision_path("train_moe_lm").unlink()
    assert resolve_precision("auto", "cpu") == "32-true" and len(calls) == 2


def test_another_machine_identity_measures_its_own(native_cpu, monkeypatch):
    calls, _ = native_cpu
    resolve_precision("auto", "cpu")
    other = dict(precision.cpu_identity(), cpu="Intel(R) Xeon(R) Platinum 8481C", flags="amx_bf16 amx_tile")
    monkeypatch.setattr(precision, "cpu_identity", lambda: other)
    resolve_precision("auto", "cpu")
    assert len(calls) == 2 and precision.decision_path("train_moe_lm", other).is_file()


@pytest.mark.parametrize("explicit", ["32-true", "bf16-mixed", "16-mixed", "bf16-true"])
def test_an_explicit_precision_is_never_replaced(native_cpu, explicit):
    calls, _ = native_cpu
    assert resolve_precision(explicit, "cpu") == explicit
    from specmoe_plugins.targets.tiny.stage import PretrainTarget

    assert trainer_key_facts(PretrainTarget, {"trainer": {"precision": explicit}}) == {"precision": explicit}
    assert calls == []


def test_emulated_bf16_is_float32_without_measuring(native_cpu, monkeypatch):
    calls, _ = native_cpu
    monkeypatch.setattr(trainer_mod, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision("auto", "cpu") == "32-true" and calls == []


def test_the_training_probe_runs_both_precisions():
    """The real measurement (a smaller probe than the default): a forward + backward of a GPT-OSS MoE LM in
    float32 and under bf16 autocast, each timed by this thread's CPU time."""
    times = precision.measure_training(hidden_size=64, intermediate_size=64, head_dim=16, num_local_experts=4,
                                       num_experts_per_tok=2, vocab_size=128, seq=16, iters=1)
    assert set(times) == {"32-true", "bf16-mixed"} and all(t > 0 for t in times.values())
