# SPDX-License-Identifier: Apache-2.0
"""EAGLE-3 and GTO training end to end on a tiny random target: responses are generated (and resumed), a few
optimizer steps lower the TTT loss, and the exported directories load as ``eagle3`` / ``gto`` drafters that
decode losslessly."""

from __future__ import annotations

import json
import math

import pytest
import torch
from fixtures.tiny import random_prompts

from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.stopping import StopRule
from specmoe.interfaces.stage import StageContext
from specmoe.registry import drafters, selectors
from specmoe.training.response_data import (
    PromptItem,
    collate_responses,
    read_responses,
    response_loader,
    write_responses,
)
from specmoe.training.teacher import teacher_forward
from specmoe_plugins.drafters.eagle3.checkpoint import load_eagle3
from specmoe_plugins.drafters.eagle3.model import capture_indices
from specmoe_plugins.drafters.eagle3.stage import TrainEagle3
from specmoe_plugins.drafters.eagle3.ttt import TTTOutput, shift, ttt_loss, ttt_unroll
from specmoe_plugins.drafters.gto.stage import TrainGTO

pytestmark = pytest.mark.integration

TRAINER = {"accelerator": "cpu", "max_epochs": -1, "enable_progress_bar": False, "num_threads": 1,
           "log_every_n_steps": 1}


def _losses(model, target, ds) -> tuple[float, float]:
    """(TTT loss of ``model``, the same loss of a draft that outputs the target's own distribution)."""
    batch = collate_responses([ds[i] for i in range(len(ds))])
    layers = capture_indices(model.config.aux_layer_ids, target.num_hidden_layers)
    with torch.no_grad():
        ids, valid = batch["input_ids"], batch["valid"]
        feats, tlogits = teacher_forward(target, ids, valid, layers, torch.device("cpu"))
        out = ttt_unroll(model, batch["input_ids"], feats, batch["valid"], 3)
        args = (tlogits, batch["loss_mask"], batch["valid"], model.t2d)
        n = tlogits.shape[1] - 1
        ideal = TTTOutput([shift(tlogits[..., model.t2d], 1 + j, n) for j in range(3)], [], None, None, None)
        return float(ttt_loss(out, *args)[0]), float(ttt_loss(ideal, *args)[0])


def _lossless(target, drafter, prompts) -> None:
    stop = StopRule(12, stop_ids=target.eos_token_ids)
    engine = SpeculativeEngine(target, drafter, selectors.get("confidence")())
    for p in prompts:
        ref = ar_generate(target, [p], temperature=0, stop=stop).tokens[0]
        assert engine.generate([p], budget=4, steps=3, top_k=2, temperature=0, stop=stop).tokens[0] == ref


def test_train_eagle3_then_gto(make_target, tmp_path):
    target = make_target("qwen3_moe")
    prompts = random_prompts(12, [5, 9], target.vocab_size, seed=3)
    items = [PromptItem(f"p{i}", p) for i, p in enumerate(prompts)]
    resp = tmp_path / "responses" / "responses.jsonl"
    first = write_responses(target, items[:7], resp, max_new_tokens=20, batch_size=4)
    again = write_responses(target, items, resp, max_new_tokens=20, batch_size=4)
    assert (first["written"], again["written"], again["skipped"]) == (7, 5, 7)
    recs = read_responses(resp)
    assert [r["id"] for r in recs] == [it.id for it in items]
    single = ar_generate(target, [items[8].prompt_ids], temperature=0, stop=StopRule(20)).tokens[0]
    assert recs[8]["response_ids"] == single  # batched greedy generation == one-by-one

    out = tmp_path / "eagle3"
    stage = TrainEagle3(target={"path": target.path}, data=str(resp.parent), draft_vocab_size=160,
                        ttt_length=3, batch_size=4, lr=1e-2, save_every=10,
                        trainer={**TRAINER, "max_steps": 40})
    summary = stage.run(out, StageContext())
    assert summary["steps"] == 40 and (out / "checkpoints" / "last.ckpt").is_file()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 160
    c = stage.config
    ds, _ = response_loader(read_responses(c.data), max_length=c.max_length, max_prompt_tokens=c.max_prompt_tokens,
                            batch_size=c.batch_size, shuffle=True, seed=c.seed)
    trained = load_eagle3(str(out), embed=target.parts().embed_tokens.weight, dtype=torch.float32)
    before, floor = _losses(stage.build_draft(target, ds), target, ds)
    after, _ = _losses(trained, target, ds)
    assert after - floor < 0.6 * (before - floor), (before, after, floor)  # the excess (KL) loss shrinks
    assert stage.run(out, StageContext())["steps"] == 40  # a rerun resumes from last.ckpt: nothing left to do

    drafter = drafters.get("eagle3")(path=str(out))
    drafter.setup(target)
    _lossless(target, drafter, [items[0].prompt_ids, *random_prompts(2, [4, 13], target.vocab_size, seed=8)])

    gto_out = tmp_path / "gto"
    gto = TrainGTO(target={"path": target.path}, data=str(resp.parent), drafter=str(out), ttt_length=3,
                   batch_size=4, lr=1e-4, group_size=4, num_groups=4, trainer={**TRAINER, "max_steps": 3})
    gsum = gto.run(gto_out, StageContext())
    assert gsum["steps"] == 3 and math.isfinite(gsum["train/gto_loss"]) and gsum["train/reward"] > 0
    gd = drafters.get("gto")(path=str(gto_out))
    gd.setup(target)
    _lossless(target, gd, [items[1].prompt_ids])
