# SPDX-License-Identifier: Apache-2.0
"""``train_mtp`` end to end on a tiny target: responses.jsonl in, a few optimizer steps (the loss goes down),
MLflow metrics, a Lightning checkpoint that a re-run resumes from, and an exported head that loads as the
``mtp`` drafter and keeps greedy decoding lossless."""

from __future__ import annotations

import json

import pytest
from fixtures.tiny import random_prompts

from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.stopping import StopRule
from specmoe.interfaces.stage import StageContext
from specmoe.registry import drafters, selectors, stages

pytestmark = pytest.mark.integration
STEPS = 30


def _responses(target, path, n=48):
    prompts = random_prompts(n, [4, 7, 11], target.vocab_size, seed=9)
    gen = ar_generate(target, prompts, temperature=0, stop=StopRule(24), capture_routing=False)
    path.mkdir(parents=True, exist_ok=True)
    with (path / "responses.jsonl").open("w") as f:
        for i, (p, r) in enumerate(zip(prompts, gen.tokens)):
            f.write(json.dumps({"id": i, "prompt_ids": p, "response_ids": r}) + "\n")
    return path


@pytest.mark.parametrize("arch,depths", [("qwen3_moe", 1), ("gpt_oss", 2)])
def test_train_mtp_stage(make_target, tmp_path, arch, depths):
    import mlflow

    target = make_target(arch)
    resp = _responses(target, tmp_path / "responses")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ctx = StageContext(tracking_uri=uri, run_dir=tmp_path)
    opts = dict(target={"path": target.path}, responses=str(resp), batch_size=8, lr=3e-3, warmup_steps=5,
                depths=depths, kl_weight=0.5, checkpoint_every_n_steps=10,
                trainer={"max_steps": STEPS, "max_epochs": 100, "accelerator": "cpu", "num_threads": 1,
                         "enable_progress_bar": False, "log_every_n_steps": 5})
    out = tmp_path / "mtp"
    summary = stages.get("train_mtp")(**opts).run(out, ctx)
    assert summary["steps"] == STEPS
    print(summary)
    assert summary["last_loss"] < summary["first_loss"] - 0.2, summary
    assert (out / "checkpoints" / "last.ckpt").is_file()
    assert {"val/loss", f"val/acc_d{depths}"} <= set(summary)

    runs = mlflow.MlflowClient(tracking_uri=uri).search_runs(
        [e.experiment_id for e in mlflow.MlflowClient(tracking_uri=uri).search_experiments()])
    assert any("train/loss" in r.data.metrics for r in runs)

    # a re-run resumes from last.ckpt: nothing left to train, same export
    again = stages.get("train_mtp")(**opts).run(out, StageContext())
    assert again["steps"] == STEPS and again["first_loss"] is None

    drafter = drafters.get("mtp")(path=str(out))
    drafter.setup(target)
    assert drafter.head.spec.mlp == "dense"
    engine = SpeculativeEngine(target, drafter, selectors.get("confidence")())
    for p in random_prompts(3, [5, 13], target.vocab_size, seed=3):
        ref = ar_generate(target, [p], temperature=0, stop=StopRule(20)).tokens[0]
        got = engine.generate([p], budget=4, steps=3, top_k=2, temperature=0, stop=StopRule(20))
        assert got.tokens[0] == ref


def test_missing_responses_is_a_user_error(make_target, tmp_path):
    from specmoe.errors import UserError

    target = make_target("qwen3_moe")
    with pytest.raises(UserError, match="responses.jsonl"):
        stages.get("train_mtp")(target={"path": target.path}, responses=str(tmp_path)).run(
            tmp_path / "out", StageContext())
    with pytest.raises(UserError, match="not resolved"):
        stages.get("train_mtp")(target={"path": target.path}).run(tmp_path / "out", StageContext())
