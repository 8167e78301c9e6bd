# SPDX-License-Identifier: Apache-2.0
"""``pretrain_target`` stage end to end on a very small GPT-OSS config: export and resume, the step-budget
schedule, the opt-in wall-clock guard, router balancing and the collapse check at every validation."""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

import pytest
import torch

from specmoe.interfaces.stage import StageContext
from specmoe.training.trainer import TrainerOptions
from specmoe_plugins.targets.tiny.router_balance import RouterCollapseError, balance_stats, check_router_collapse
from specmoe_plugins.targets.tiny.text_data import TextSource

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"

SMALL = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
             sliding_window=16, initializer_range=0.02, router_aux_loss_coef=0.1)


def _gsm8k_lines(tmp_path: Path) -> Path:
    """A data dir with a few GSM8K lines (the real files when present, else look-alikes)."""
    root = tmp_path / "data"
    (root / "gsm8k").mkdir(parents=True)
    for split, n in (("train", 40), ("test", 4)):
        src = DATA / "gsm8k" / f"{split}.jsonl"
        if src.is_file():
            lines = src.read_text().splitlines(keepends=True)[:n]
        else:
            lines = [json.dumps({"question": f"Tom has {i} pens and buys {i + 2}. How many pens?",
                                 "answer": f"Tom has {i}+{i + 2} = <<{i}+{i + 2}={2 * i + 2}>>{2 * i + 2} "
                                           f"pens.\n#### {2 * i + 2}"}) + "\n" for i in range(n)]
        (root / "gsm8k" / f"{split}.jsonl").write_text("".join(lines))
    return root


def _stage(max_steps: int):
    from specmoe_plugins.targets.tiny.stage import PretrainTarget

    trainer = TrainerOptions(max_epochs=-1, max_steps=max_steps, val_check_interval=2,
                             check_val_every_n_epoch=None, log_every_n_steps=1, enable_progress_bar=False,
                             num_threads=1, precision="32-true")  # the same on every CPU
    return PretrainTarget(model=dict(SMALL), vocab_size=320, block_size=64, batch_size=4, docs_per_context=3,
                          val_fraction=0.1, trainer=trainer, lr=1e-3, warmup_steps=1,
                          checkpoint_every_n_steps=2, test=TextSource(path="gsm8k/test.jsonl", limit=4),
                          sample_tokens=8)


@pytest.mark.integration
def test_stage_exports_loadable_checkpoint_and_resumes(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from specmoe_plugins.targets.hf import HFTarget

    torch.set_num_threads(1)
    data = _gsm8k_lines(tmp_path)
    out = tmp_path / "target"
    monkeypatch.setenv("SPECMOE_DATA_DIR", str(data))  # ctx.data_dir is None: the env var is the fallback
    summary = _stage(4).run(out, StageContext())
    for key in ("val_perplexity", "test_perplexity", "load_balance", "train_time_s", "train_tokens",
                "samples", "expert_bytes_fp32"):
        assert key in summary, key
    assert summary["complete"] and summary["steps"] == 4 and summary["train_tokens"] == 4 * 4 * 64
    assert 1.0 < summary["test_perplexity"] < 2 * 320 and len(summary["samples"]) == 3
    assert set(summary["load_balance"]) == {"layer0", "layer1"}
    assert json.loads((out / "summary.json").read_text()) == summary
    assert (out / "checkpoints" / "last.ckpt").is_file() and len(list(out.glob("logs/*/metrics.csv"))) == 1

    target = HFTarget(path=str(out))
    tok = AutoTokenizer.from_pretrained(str(out))
    assert target.vocab_size == len(tok) == 320 and target.num_experts == 8 and target.top_k == 2
    assert tok.eos_token_id in target.eos_token_ids
    assert target.tokenizer.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False,
                                                add_generation_prompt=True).endswith("Question: q\nAnswer:")

    assert _stage(4).run(out, StageContext(data_dir=data)) == summary  # finished: nothing is redone

    # a run killed after training (no export yet) resumes from last.ckpt and continues to the new max_steps
    for name in ("summary.json", "model.safetensors", "config.json"):
        (out / name).unlink()
    time.sleep(1.1)  # a new log folder name
    resumed = _stage(6).run(out, StageContext(data_dir=data))
    assert resumed["steps"] == 6 and resumed["train_tokens"] == 6 * 4 * 64
    first, second = (list(csv.DictReader(p.open())) for p in sorted(out.glob("logs/*/metrics.csv")))
    assert {"train/aux_loss", "balance/layer1/top_k_share", "val/ppl"} <= set(first[0])
    steps = [{int(r["step"]) for r in rows if r["train/loss"]} for rows in (first, second)]
    assert len(steps[0]) == 4 and len(steps[1]) == 2
    assert min(steps[1]) > max(steps[0])  # no step is trained twice


def test_stage_needs_a_data_dir(tmp_path, monkeypatch):
    from specmoe.errors import UserError

    monkeypatch.delenv("SPECMOE_DATA_DIR", raising=False)
    with pytest.raises(UserError, match="SPECMOE_DATA_DIR"):
        _stage(1).run(tmp_path / "x", StageContext())
    assert not (tmp_path / "x" / "checkpoints").exists()


def test_collapse_check_on_synthetic_counts():
    uniform = torch.full((3, 32), 100)
    stats = check_router_collapse(uniform, top_k=4)
    assert stats[0]["top_k_share"] == pytest.approx(4 / 32) and stats[0]["entropy"] == pytest.approx(1.0)
    skewed = uniform.clone()
    skewed[1, :4] = 2000  # layer 1: 2000*4 / (8000 + 2800) = 74% on 4 experts
    with pytest.raises(RouterCollapseError, match="layer 7: 74%"):
        check_router_collapse(skewed, top_k=4, layer_ids=[3, 7, 11])
    mild = uniform.clone()
    mild[0, :4] = 400  # 52%: unbalanced but below the default limit of 56%
    assert check_router_collapse(mild, top_k=4)[0]["max_load"] == pytest.approx(32 * 400 / 4400)
    dead = torch.zeros(1, 8, dtype=torch.long)
    dead[0, :2] = 50
    assert balance_stats(dead, 2)[0]["dead"] == 6
    with pytest.raises(RouterCollapseError):
        check_router_collapse(dead, top_k=2)
    spread = torch.full((1, 8), 100)
    spread[0, 7] = 0  # balanced, but one expert never chosen
    assert check_router_collapse(spread, top_k=2, max_dead_fraction=0.125)
    with pytest.raises(RouterCollapseError, match="1 of 8 experts unused.*at most 0 unused"):
        check_router_collapse(spread, top_k=2, max_dead_fraction=0.0)
    assert check_router_collapse(torch.tensor([[0, 0, 90, 10]]), top_k=4)  # k == E cannot collapse


def test_forced_routing_has_exact_union():
    from specmoe_plugins.selectors.goodput.expert_latency import fit_line, forced_routing

    gen = torch.Generator().manual_seed(0)
    for u in range(4, 33):
        idx, w = forced_routing(8, 4, u, 32, gen)
        assert idx.shape == (8, 4) and idx.unique().numel() == u
        assert all(row.unique().numel() == 4 for row in idx)  # distinct experts within a token
        assert torch.allclose(w.sum(-1), torch.ones(8))
    with pytest.raises(ValueError):
        forced_routing(8, 4, 3, 32, gen)
    a, b, r2 = fit_line([1.0, 2.0, 3.0], [3.0, 5.0, 7.0])
    assert (a, b, r2) == pytest.approx((1.0, 2.0, 1.0))


@pytest.mark.parametrize("mode", ["experts", "model"])
def test_expert_latency_routes_through_the_real_experts(make_target, mode):
    """Both modes reach every experts module with exactly ``u`` distinct experts per layer."""
    from specmoe_plugins.selectors.goodput.expert_latency import measure

    target = make_target("gpt_oss")
    seen: list[int] = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: seen.append(int(args[1].unique().numel())))
             for m in target.experts_modules()]
    try:
        times = measure(target, [2, 5], gamma=4, mode=mode, context=8, iters=1, warmup=0)
    finally:
        for h in hooks:
            h.remove()
    assert set(times) == {2, 5} and all(len(v) == 1 and v[0] > 0 for v in times.values())
    layers = len(target.experts_modules())
    timed = seen[-2 * layers:]  # the prefill of --mode model comes first
    assert sorted(timed) == [2] * layers + [5] * layers


@pytest.mark.parametrize("arch", ["gpt_oss", "qwen3_moe", "deepseek_v3"])
def test_training_experts_match_eager(arch):
    """The sorted-loop training kernel computes HF's ``eager`` experts: same logits, same gradients."""
    import transformers

    from specmoe.models.tiny import tiny_config
    from specmoe_plugins.targets.tiny.module import TRAIN_EXPERTS, _register_train_experts

    _register_train_experts()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(arch), attn_implementation="eager")
    ids = torch.randint(0, 256, (2, 24))
    results = []
    for impl in ("eager", TRAIN_EXPERTS):
        model.set_experts_implementation(impl)
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((out.logits.detach(), grads))
    (ref_logits, ref_grads), (logits, grads) = results
    assert torch.allclose(logits, ref_logits, atol=1e-5, rtol=1e-5)
    assert set(grads) == set(ref_grads) and any("experts" in n for n in grads)
    for name, g in ref_grads.items():
        assert torch.allclose(grads[name], g, atol=1e-6, rtol=1e-4), name


@pytest.mark.integration
def test_stage_logs_a_nested_mlflow_run(tmp_path):
    from mlflow.tracking import MlflowClient

    torch.set_num_threads(1)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("recipe", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(exp, run_name="recipe-run").info.run_id
    ctx = StageContext(data_dir=_gsm8k_lines(tmp_path), tracking_uri=uri, parent_run_id=parent)
    summary = _stage(2).run(tmp_path / "target", ctx)
    (child,) = [r for r in client.search_runs([exp]) if r.info.run_id != parent]
    assert child.data.tags["mlflow.parentRunId"] == parent and child.info.status == "FINISHED"
    assert child.data.metrics["test_perplexity"] == pytest.approx(summary["test_perplexity"])
    assert "train/loss" in child.data.metrics and "balance/layer0/top_k_share" in child.data.metrics
    assert child.data.params["trainer.precision"] == summary["precision"] == "32-true"  # resolved, not "auto"
    assert child.data.params["trainer.num_threads"] == "1"
    assert [a.path for a in client.list_artifacts(child.info.run_id)] == ["summary.json"]


def test_default_target_is_the_chosen_gpt_oss_size():
    """``{id: target, name: pretrain_target}`` with no options: GPT-OSS, 4 layers, 32 experts of >= 1 MB."""
    from specmoe.models.tiny import tiny_config
    from specmoe_plugins.targets.tiny.stage import DEFAULT_MODELS, PretrainTarget

    cfg = PretrainTarget().config
    assert cfg.arch == "gpt_oss" and cfg.model == {} and cfg.trainer.max_time is None
    assert cfg.trainer.precision == "auto" and cfg.trainer.max_steps > 0
    assert cfg.sources[0].path == "gsm8k/train.jsonl" and cfg.test.path == "gsm8k/test.jsonl"
    hf = tiny_config("gpt_oss", **DEFAULT_MODELS["gpt_oss"])
    shape = (hf.num_hidden_layers, hf.hidden_size, hf.num_local_experts, hf.num_experts_per_tok)
    assert shape == (4, 256, 32, 4)
    assert hf.layer_types == ["sliding_attention", "full_attention"] * 2
    h, i = hf.hidden_size, hf.intermediate_size
    assert 4 * (3 * h * i + 2 * i + h) >= 1_000_000  # gate_up [H, 2I] + down [I, H] + biases, fp32


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")
def test_schedule_is_transformers_cosine_over_max_steps(tmp_path):
    """Warm-up then cosine to ``lr * min_lr_ratio`` exactly at ``max_steps``, whatever the clock says."""
    import lightning as L
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    from specmoe.models.tiny import tiny_config
    from specmoe_plugins.targets.tiny.module import PretrainLM

    torch.set_num_threads(1)
    module = PretrainLM(tiny_config("gpt_oss", vocab_size=64, **SMALL).to_dict(), lr=1e-3, warmup_steps=2,
                        min_lr_ratio=0.1, fail_on_collapse=False)
    seen: list[float] = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, *args):
            seen.append(trainer.optimizers[0].param_groups[0]["lr"])

    loader = torch.utils.data.DataLoader([{"input_ids": b} for b in torch.randint(0, 64, (8, 16))], batch_size=4)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, max_steps=6, max_epochs=-1, limit_val_batches=0,
                        callbacks=[Record()], default_root_dir=str(tmp_path))
    trainer.fit(module, loader)
    ref_opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3)
    ref = get_cosine_with_min_lr_schedule_with_warmup(ref_opt, 2, 6, min_lr_rate=0.1)
    expected = []
    for _ in range(6):
        expected.append(ref_opt.param_groups[0]["lr"])
        ref_opt.step()
        ref.step()
    assert seen == pytest.approx(expected) and expected[2] == pytest.approx(1e-3)
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(1e-4)  # the floor at max_steps


@pytest.mark.integration
def test_wall_clock_guard_reports_an_incomplete_stage_and_the_rerun_resumes(tmp_path):
    """``trainer.max_time`` stops long before ``max_steps``: the stage raises ``StageIncomplete`` (no
    export, no finished summary), ``last.ckpt`` holds the step it stopped at, and a rerun continues from it."""
    from specmoe.errors import StageIncomplete
    from specmoe_plugins.targets.tiny.stage import PretrainTarget

    torch.set_num_threads(1)
    data = _gsm8k_lines(tmp_path)
    out = tmp_path / "target"
    trainer = TrainerOptions(max_epochs=-1, max_steps=100_000, max_time="00:00:00:01", val_check_interval=None,
                             check_val_every_n_epoch=None, log_every_n_steps=1, enable_progress_bar=False,
                             num_threads=1, precision="32-true")
    stage = PretrainTarget(model=dict(SMALL), vocab_size=320, block_size=32, batch_size=2, val_fraction=0.1,
                           trainer=trainer, warmup_steps=1, checkpoint_every_n_steps=100_000, num_samples=0)
    stopped_at = []
    for _ in range(2):
        with pytest.raises(StageIncomplete, match=r"NOT complete.*last\.ckpt.*Run the same command again"):
            stage.run(out, StageContext(data_dir=data))
        ckpt = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        stopped_at.append(int(ckpt["global_step"]))
        assert not (out / "summary.json").exists() and not (out / "model.safetensors").exists()
    assert 0 < stopped_at[0] < stopped_at[1] < 100_000  # the second run continued from the first's step


def test_collapse_stops_training_at_the_first_validation(tmp_path):
    """A router forced onto two experts fails the first validation of ``fit`` (step 2 of 50), with a message
    naming the step, the layers and the fix."""
    import lightning as L

    from specmoe.models.tiny import tiny_config
    from specmoe_plugins.targets.tiny.module import PretrainLM

    torch.set_num_threads(1)
    module = PretrainLM(tiny_config("gpt_oss", vocab_size=64, **SMALL).to_dict(), lr=1e-6)
    with torch.no_grad():
        for layer in module.model.model.layers:
            layer.mlp.router.bias[:2] = 100.0
    loader = torch.utils.data.DataLoader([{"input_ids": b} for b in torch.randint(0, 64, (8, 16))], batch_size=4)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, max_steps=50, max_epochs=-1, val_check_interval=2,
                        check_val_every_n_epoch=None, num_sanity_val_steps=0, default_root_dir=str(tmp_path))
    with pytest.raises(RouterCollapseError, match=r"at the validation at step 2 \(layer 0: 100%.*balance_rate"):
        trainer.fit(module, loader, loader)
    assert trainer.global_step == 2


def test_router_losses_are_per_layer():
    """Two layers collapsed onto different experts look balanced when pooled (HF's loss) but not per layer."""
    from specmoe_plugins.targets.tiny.router_balance import router_losses

    uniform = torch.zeros(64, 8)
    aux, z = router_losses([uniform, uniform], top_k=2)
    assert float(aux) == pytest.approx(1.0) and float(z) == pytest.approx(math.log(8) ** 2)
    a, b = torch.full((64, 8), -10.0), torch.full((64, 8), -10.0)
    a[:, :4] = 10.0  # layer 0 uses experts 0-3 only, layer 1 experts 4-7: pooled load is uniform
    b[:, 4:] = 10.0
    aux, _ = router_losses([a, b], top_k=2)
    assert float(aux) == pytest.approx(2.0, rel=1e-3)  # E * (1/4 * 1/4) * 4 = 2: twice the balanced value


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")
def test_bias_balancing_moves_load_to_idle_experts(tmp_path):
    """DeepSeek-V3-style balancing: the router biases leave the optimizer and move towards balance."""
    import lightning as L

    from specmoe.models.tiny import tiny_config
    from specmoe_plugins.targets.tiny.module import PretrainLM
    from specmoe_plugins.targets.tiny.router_balance import BiasBalancer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = tiny_config("gpt_oss", vocab_size=64, **{**SMALL, "router_aux_loss_coef": 0.0}).to_dict()
    module = PretrainLM(cfg, lr=1e-3, balance_rate=0.05, fail_on_collapse=False)
    with torch.no_grad():
        for layer in module.model.model.layers:
            layer.mlp.router.bias[:2] = 0.5  # experts 0 and 1 favoured
    data = torch.randint(0, 64, (16, 16), generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader([{"input_ids": b} for b in data], batch_size=4)
    share = []
    for steps in (0, 40):
        if steps:
            L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, max_steps=steps, max_epochs=-1, limit_val_batches=0,
                      default_root_dir=str(tmp_path)).fit(module, loader)
        L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                  default_root_dir=str(tmp_path)).validate(module, loader, verbose=False)
        share.append(max(s["top_k_share"] for s in module.last_balance))
    biases = [layer.mlp.router.bias for layer in module.model.model.layers]
    assert all(not b.requires_grad for b in biases)
    assert all(b[:2].max() < 0.5 for b in biases) and share[1] < share[0]
    with pytest.raises(Exception, match="no router bias"):
        BiasBalancer(__import__("transformers").AutoModelForCausalLM.from_config(
            tiny_config("qwen3_moe")), 0.01)
