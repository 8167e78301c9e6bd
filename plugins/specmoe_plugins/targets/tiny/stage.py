# SPDX-License-Identifier: Apache-2.0
"""``pretrain_target``: train a small MoE target (default: GPT-OSS architecture) on local text.

Trains a byte-level BPE tokenizer and then the model (Lightning) on GSM8K train (question + worked answer),
and exports a Hugging Face checkpoint into ``out_dir`` itself, so ``target: {name: hf, path: stage:<id>}``
loads it. Lightning checkpoints live in ``out_dir/checkpoints/`` (a killed run resumes from ``last.ckpt``),
CSV logs in ``out_dir/logs/<start time>/``. ``summary.json`` holds validation and GSM8K-test perplexity,
per-layer expert load balance, train time and tokens, and greedy continuations of a few GSM8K test questions.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from specmoe.errors import UserError
from specmoe.interfaces.stage import Stage, StageContext
from specmoe.training.trainer import OptimizerOptions, TrainerOptions, stage_trainer_options, trainer_key_facts
from specmoe_plugins.targets.tiny.router_balance import RouterCollapseError
from specmoe_plugins.targets.tiny.text_data import GSM8K_TRAIN, TextSource

__all__ = ["PretrainTarget", "DEFAULT_MODELS"]

logger = logging.getLogger(__name__)

#: per-architecture training defaults under the recipe's ``model`` overrides (over ``tiny_config(arch)``).
#: GPT-OSS scaled down: 4 layers (sliding window 128 on alternate layers), hidden 256, 32 experts top-4,
#: expert intermediate 384 (one expert: 3*256*384 fp32 weights + biases = 1.18 MB). The other two only
#: get a trainable init scale (their tiny configs are for random-weight tests).
DEFAULT_MODELS: dict[str, dict[str, Any]] = {
    "gpt_oss": dict(hidden_size=256, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
                    sliding_window=128, initializer_range=0.02, router_aux_loss_coef=0.02,
                    tie_word_embeddings=False),
    "qwen3_moe": dict(initializer_range=0.02, router_aux_loss_coef=0.02),
    "deepseek_v3": dict(initializer_range=0.02),
}


def _default_trainer() -> TrainerOptions:
    # the step budget sets the length (and the cosine schedule): the same on every machine. precision auto:
    # bf16-mixed where bf16 is native (weights and export stay fp32), fp32 elsewhere.
    return TrainerOptions(max_epochs=-1, max_steps=200, val_check_interval=50, check_val_every_n_epoch=None,
                          log_every_n_steps=10, gradient_clip_val=1.0, enable_progress_bar=True)


class PretrainTarget(Stage):
    """Pretrain a tiny MoE causal LM and export it as a HF checkpoint directory."""

    description = "pretrain a small GPT-OSS-style MoE target on GSM8K train (HF checkpoint + tokenizer)"
    version = "1"
    key_facts = classmethod(trainer_key_facts)  # resolved precision in the cache key
    distributed = True  # Lightning DDP under torchrun / SLURM: every rank trains, rank 0 exports

    @dataclass
    class Config(OptimizerOptions):
        arch: str = "gpt_oss"
        """architecture of :mod:`specmoe.models.tiny` (``gpt_oss``, ``qwen3_moe``, ``deepseek_v3``)."""
        model: dict[str, Any] = field(default_factory=dict)
        """HF config overrides, applied over :data:`DEFAULT_MODELS` ``[arch]`` and ``tiny_config(arch)``
        (``vocab_size`` and the special token ids come from the tokenizer)."""
        vocab_size: int = 4096
        """BPE vocabulary size (bytes and special tokens included)."""
        sources: list[TextSource] = field(default_factory=lambda: [GSM8K_TRAIN])
        """training JSONL files relative to the data directory (never a test split)."""
        block_size: int = 1024
        """tokens per training sequence (covers a 5-shot GSM8K prompt plus its answer)."""
        docs_per_context: int = 6
        """documents joined by a blank line per context at most (k-shot prompts are in-distribution)."""
        batch_size: int = 2
        val_fraction: float = 0.02
        lr: float = 2e-3
        """peak AdamW learning rate (2e-3: the best of 1.4e-3, 2e-3, 3e-3, 6e-3 at 200 steps of the demo)."""
        weight_decay: float = 0.1
        warmup_steps: int = 20
        min_lr_ratio: float = 0.1
        trainer: TrainerOptions = field(default_factory=_default_trainer)
        """Lightning Trainer options; ``max_steps`` is the training length and the schedule's. Defaults:
        ``max_steps: 200, max_epochs: -1, val_check_interval: 50, check_val_every_n_epoch: null,
        gradient_clip_val: 1.0, precision: auto, log_every_n_steps: 10``; a recipe's partial ``trainer:``
        mapping keeps the others. ``max_time`` is an opt-in guard: a stage it stops is not complete."""
        seed: int = 0
        router_z_loss_coef: float = 0.0
        """router z-loss weight (ST-MoE); the load-balancing loss weight is the model's
        ``router_aux_loss_coef``."""
        balance_rate: Optional[float] = None
        """auxiliary-loss-free balancing (DeepSeek-V3): router-bias update per optimizer step (0: off;
        null: ``DEFAULT_BALANCE_RATE`` of this folder's ``module.py`` where the router has a bias, GPT-OSS and
        DeepSeek-V3, else 0)."""
        checkpoint_every_n_steps: int = 50
        collapse_fraction: float = 0.5
        """router-collapse limit on the share of each layer's top-k busiest experts, checked at every
        validation and on the test text (see ``check_router_collapse`` in ``router_balance.py``)."""
        max_dead_fraction: float = 0.25
        """router-collapse limit on the share of experts without any token (1: not checked)."""
        test: Optional[TextSource] = field(
            default_factory=lambda: TextSource(path="gsm8k/test.jsonl", limit=200))
        """evaluation text (never trained on) for the summary's test perplexity, load balance and samples
        (records with a ``question``); null: use the validation split."""
        num_samples: int = 3
        """greedy continuations of test questions written to the summary."""
        sample_tokens: int = 96

    # ------------------------------------------------------------------ run
    def run(self, out_dir: Path, ctx: StageContext) -> dict[str, Any]:
        import lightning as L
        import torch

        from specmoe.training.checkpoints import resume_checkpoint
        from specmoe_plugins.targets.tiny.module import PretrainLM
        from specmoe_plugins.targets.tiny.text_data import TextDataModule

        cfg = self.config
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        done = out / "summary.json"
        if done.is_file() and json.loads(done.read_text()).get("complete"):
            return json.loads(done.read_text())
        data_dir = self._data_dir(ctx)
        sources = [s if isinstance(s, TextSource) else TextSource(**s) for s in cfg.sources]
        topts = stage_trainer_options(type(self), {"trainer": cfg.trainer})
        L.seed_everything(cfg.seed, workers=True, verbose=False)

        tokenizer = self._tokenizer(out, data_dir, sources)
        data = TextDataModule(tokenizer, data_dir, sources, block_size=cfg.block_size,
                              batch_size=cfg.batch_size, val_fraction=cfg.val_fraction, seed=cfg.seed,
                              docs_per_context=cfg.docs_per_context)
        module = PretrainLM(self._model_config(tokenizer), **cfg.optimizer(), min_lr_ratio=cfg.min_lr_ratio,
                            router_z_loss_coef=cfg.router_z_loss_coef, balance_rate=cfg.balance_rate,
                            collapse_fraction=cfg.collapse_fraction, max_dead_fraction=cfg.max_dead_fraction)
        trainer = self._trainer(topts, out, ctx)
        ckpt = out / "checkpoints" / "last.ckpt"
        started = time.perf_counter()
        with warnings.catch_warnings():  # TextDataModule resumes mid-epoch itself (SeededSampler.resume_at)
            warnings.filterwarnings("ignore", message=".*your dataloader is not resumable.*")
            trainer.fit(module, datamodule=data, ckpt_path=resume_checkpoint(ckpt))
        trainer.save_checkpoint(str(ckpt))
        if not trainer.is_global_zero:  # multi-process runs: rank 0 exports and evaluates
            return {"complete": False, "rank": int(trainer.global_rank)}
        train_s = time.perf_counter() - started

        module.model.config.output_router_logits = False
        module.counter.remove()
        module.model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        steps = int(trainer.global_step)
        world = int(trainer.world_size)
        summary = dict(
            complete=True, arch=cfg.arch, steps=steps, train_time_s=round(train_s, 1),
            train_tokens=steps * cfg.batch_size * cfg.block_size * topts.accumulate_grad_batches * world,
            corpus_train_tokens=int(data.train_tokens), corpus_val_tokens=int(data.val_tokens),
            precision=str(trainer.precision), threads=torch.get_num_threads(), balance_rate=module.balance_rate,
            seconds_per_step=round(train_s / max(1, steps - module.start_step), 3),
            **self._model_facts(module.model))
        del module, trainer
        summary.update(self._evaluate(out, data, data_dir))
        collapse = summary.pop("collapse")
        if collapse:
            summary.update(complete=False, collapse=collapse)
        done.write_text(json.dumps(summary, indent=2))
        self._log_summary(ctx, summary, out)
        if collapse:
            raise RouterCollapseError(f"stage pretrain_target ({out}): {collapse}")
        return summary

    # ------------------------------------------------------------------ pieces
    def _data_dir(self, ctx: StageContext) -> Path:
        data_dir = ctx.data_dir or os.environ.get("SPECMOE_DATA_DIR")
        if not data_dir:
            raise UserError("stage pretrain_target: no data directory: set 'data_dir' in the recipe or "
                            "SPECMOE_DATA_DIR (a folder with gsm8k/train.jsonl)")
        return Path(data_dir)

    def _tokenizer(self, out: Path, data_dir: Path, sources: list[TextSource]):
        from specmoe.stages.runner import rank_world
        from specmoe_plugins.targets.tiny.text_data import read_documents
        from specmoe_plugins.targets.tiny.tokenizer import load_tokenizer, train_bpe_tokenizer

        if (out / "tokenizer.json").is_file():
            return load_tokenizer(out)
        tokenizer = train_bpe_tokenizer(read_documents(data_dir, sources), self.config.vocab_size)
        if rank_world()[0] != 0:  # deterministic training: every process has the same tokenizer
            return tokenizer
        tokenizer.save_pretrained(out)
        return load_tokenizer(out)

    def _model_config(self, tokenizer: Any) -> dict[str, Any]:
        from specmoe.models.tiny import tiny_config

        cfg = self.config
        overrides = {**DEFAULT_MODELS.get(cfg.arch, {}), **cfg.model}
        overrides.update(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        try:
            hf = tiny_config(cfg.arch, **overrides)
        except (ValueError, TypeError) as exc:
            raise UserError(f"stage pretrain_target: bad 'arch'/'model' options: {exc}") from exc
        return hf.to_dict()

    def _trainer(self, topts: TrainerOptions, out: Path, ctx: StageContext):
        from lightning.pytorch.callbacks import ModelCheckpoint
        from lightning.pytorch.loggers import CSVLogger

        from specmoe.training.trainer import build_trainer, mlflow_logger

        attempt = time.strftime("%Y%m%d-%H%M%S")  # one CSV per (re)start: a resume keeps earlier curves
        loggers: list[Any] = [CSVLogger(save_dir=str(out), name="logs", version=attempt)]
        self._mlflow = None
        if ctx.tracking_uri:
            self._mlflow = mlflow_logger(ctx, "pretrain_target")
            loggers.append(self._mlflow)
        ckpt = ModelCheckpoint(dirpath=str(out / "checkpoints"), save_last=True, save_top_k=0,
                               every_n_train_steps=max(1, self.config.checkpoint_every_n_steps))
        return build_trainer(topts, out, callbacks=[ckpt], logger=loggers)

    @staticmethod
    def _model_facts(model: Any) -> dict[str, Any]:
        from specmoe_plugins.targets.tiny.module import num_experts_of

        c = model.config
        experts = model.model.layers[0].mlp.experts
        n_exp = num_experts_of(c)
        per_expert = sum(p.numel() for p in experts.parameters()) // n_exp
        return dict(params=sum(p.numel() for p in model.parameters()), num_experts=n_exp,
                    top_k=int(c.num_experts_per_tok), num_layers=int(c.num_hidden_layers),
                    hidden_size=int(c.hidden_size), intermediate_size=int(c.intermediate_size),
                    expert_bytes_fp32=int(per_expert * 4), vocab_size=int(c.vocab_size))

    def _evaluate(self, out: Path, data: Any, data_dir: Path) -> dict[str, Any]:
        """Perplexity and load balance of the exported checkpoint, loaded as the ``hf`` target; samples."""
        from specmoe.registry import targets
        from specmoe_plugins.targets.tiny.module import evaluate_blocks
        from specmoe_plugins.targets.tiny.router_balance import balance_stats, check_router_collapse
        from specmoe_plugins.targets.tiny.text_data import pack_documents, read_documents

        HFTarget = targets.get("hf")  # the exported checkpoint, loaded as any recipe would load it

        cfg = self.config
        target = HFTarget(path=str(out))
        model, tok = target.model, target.tokenizer
        res: dict[str, Any] = {}
        val_loss, counts, layer_ids = evaluate_blocks(model, data.val_blocks, cfg.batch_size)
        res.update(val_loss=_round(val_loss), val_perplexity=_round(math.exp(min(val_loss, 50.0))))
        records: list[dict[str, Any]] = []
        test = cfg.test if isinstance(cfg.test, (TextSource, type(None))) else TextSource(**cfg.test)
        if test is not None:
            docs = read_documents(data_dir, [test], allow_test=True)
            blocks, _ = pack_documents(docs, tok, cfg.block_size)
            test_loss, counts, layer_ids = evaluate_blocks(model, blocks, cfg.batch_size)
            res.update(test_loss=_round(test_loss), test_perplexity=_round(math.exp(min(test_loss, 50.0))),
                       test_docs=len(docs), test_tokens=int(blocks.numel()))
            test_file = Path(test.path) if Path(test.path).is_absolute() else data_dir / test.path
            records = _read_records(test_file, cfg.num_samples)
        res["samples"] = [self._sample(model, tok, r) for r in records if "question" in r]
        try:
            stats = check_router_collapse(counts, target.top_k, collapse_fraction=cfg.collapse_fraction,
                                          max_dead_fraction=cfg.max_dead_fraction, layer_ids=layer_ids,
                                          where=f"the end, on the {'test' if test is not None else 'val'} text")
            res["collapse"] = None
        except RouterCollapseError as exc:
            stats = balance_stats(counts, target.top_k)
            res["collapse"] = str(exc)
        res["load_balance_on"] = "test" if test is not None else "val"
        res["load_balance"] = {f"layer{i}": {k: _round(v) for k, v in s.items()}
                               for i, s in zip(layer_ids, stats)}
        return res

    def _sample(self, model: Any, tok: Any, record: dict[str, Any]) -> dict[str, str]:
        import torch

        prompt = tok.apply_chat_template([{"role": "user", "content": record["question"]}], tokenize=False,
                                         add_generation_prompt=True)
        ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]], device=model.device)
        with torch.no_grad():
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=self.config.sample_tokens, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)
        return dict(question=record["question"], continuation=tok.decode(gen[0, ids.shape[1]:],
                                                                          skip_special_tokens=True),
                    reference=record.get("answer", ""))

    def _log_summary(self, ctx: StageContext, summary: dict[str, Any], out: Path) -> None:
        mlf = getattr(self, "_mlflow", None)
        if mlf is None:
            return
        metrics = {k: float(v) for k, v in summary.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        for layer, stats in summary.get("load_balance", {}).items():
            metrics.update({f"final/{layer}/{k}": float(v) for k, v in stats.items()})
        for key, value in metrics.items():
            if math.isfinite(value):
                mlf.experiment.log_metric(mlf.run_id, key.replace("/", "."), value)
        mlf.experiment.log_artifact(mlf.run_id, str(out / "summary.json"))
        mlf.experiment.set_terminated(mlf.run_id, "FINISHED")


def _round(x: float, digits: int = 4) -> float:
    return float(round(x, digits)) if math.isfinite(x) else float("nan")


def _read_records(path: Path, n: int) -> list[dict[str, Any]]:
    out = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if len(out) >= n:
                break
            if line.strip():
                out.append(json.loads(line))
    return out
