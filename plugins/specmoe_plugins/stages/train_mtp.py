# SPDX-License-Identifier: Apache-2.0
"""``train_mtp``: train a DeepSeek-V3 style MTP head for a target that ships none (or fine-tune one).

Inputs: the target (``hf`` target options; ``path: stage:target`` is substituted by the runner) and a
``generate_responses`` output directory (``responses.jsonl``: ``{"id", "prompt_ids", "response_ids"}``).
The target stays frozen and computes hidden states and logits online. Output: ``out_dir/config.json`` +
``out_dir/model.safetensors`` (keys ``model.layers.{N}.*``), loaded by ``drafter: {name: mtp, path: <dir>}``.
Lightning checkpoints go to ``out_dir/checkpoints`` (``last.ckpt`` is resumed by a re-run).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from specmoe.errors import UserError
from specmoe.interfaces.stage import Stage, StageContext
from specmoe.training.trainer import trainer_key_facts

__all__ = ["TrainMTP"]


class TrainMTP(Stage):
    """Train an MTP head on a frozen target's own responses."""

    description = "train a DeepSeek-V3 style MTP drafter head on a frozen target (online hidden states)"
    version = "1"
    key_facts = classmethod(trainer_key_facts)  # resolved precision in the cache key
    distributed = True  # Lightning DDP under torchrun / SLURM: every rank trains, rank 0 exports

    @dataclass
    class Config:
        target: dict[str, Any] = field(default_factory=lambda: {"path": "stage:target"})
        """``hf`` target options."""
        responses: str = "stage:responses"
        """``generate_responses`` output directory (or a ``responses.jsonl`` file)."""
        mlp: str = "dense"
        """head MLP: ``dense`` (SwiGLU) or ``moe`` (the architecture's sparse block)."""
        intermediate_size: Optional[int] = None
        """dense MLP width; default: the target's ``intermediate_size``."""
        recurse: str = "normed"
        """hidden fed to deeper draft levels: ``normed`` (norm(o), as transformers) or ``block`` (o, as
        vLLM)."""
        init_from: Optional[str] = None
        """start from existing MTP weights (a DeepSeek-V3 checkpoint or a train_mtp output)."""
        depths: int = 1
        """unrolled draft depths trained per step (1 = plain MTP objective)."""
        depth_decay: float = 0.8
        ce_weight: float = 1.0
        """weight of cross-entropy to the response token p+2."""
        kl_weight: float = 0.0
        """weight of the soft cross-entropy to the target's distribution of token p+2."""
        max_length: int = 512
        batch_size: int = 8
        lr: float = 1.0e-3
        weight_decay: float = 0.0
        warmup_steps: int = 20
        min_lr_ratio: float = 0.1
        max_prompt_tokens: Optional[int] = None
        """keep at most this many prompt tokens of each sequence (cut from the start)."""
        val_fraction: float = 0.05
        """share of the responses held out for validation (at least one when there are 20 or more)."""
        dtype: str = "float32"
        """head parameter dtype (use ``trainer.precision`` for mixed precision)."""
        checkpoint_every_n_steps: int = 200
        num_workers: int = 0
        seed: int = 0
        trainer: dict[str, Any] = field(default_factory=dict)
        """``lightning.Trainer`` options (see :class:`specmoe.training.trainer.TrainerOptions`)."""

    def run(self, out_dir: Path, ctx: StageContext) -> dict[str, Any]:
        import lightning as L
        import torch
        from lightning.pytorch.callbacks import ModelCheckpoint

        from specmoe.drafting.mtp_io import export_head, load_head
        from specmoe.drafting.mtp_model import MTPSpec, build_head
        from specmoe.training.mtp_module import MTPTrainModule
        from specmoe.training.response_data import ResponseDataset, collate_responses, read_responses
        from specmoe.training.trainer import TrainerOptions, build_trainer, mlflow_logger
        from specmoe_plugins.stages.generate_responses import build_target

        cfg = self.config
        out = Path(out_dir)
        L.seed_everything(cfg.seed, workers=True, verbose=False)
        try:
            opts = TrainerOptions(**cfg.trainer)
        except TypeError as exc:
            raise UserError(f"train_mtp.trainer: {exc}") from exc
        if str(cfg.responses).startswith("stage:"):
            raise UserError(f"train_mtp.responses '{cfg.responses}' was not resolved: run the recipe with "
                            f"'platform run'")
        rows = read_responses(cfg.responses)
        random.Random(cfg.seed).shuffle(rows)
        n_val = max(1, int(len(rows) * cfg.val_fraction)) if len(rows) >= 20 and cfg.val_fraction > 0 else 0
        train_set, val_set = (ResponseDataset(r, cfg.max_length, cfg.max_prompt_tokens)
                              for r in (rows[n_val:], rows[:n_val]))
        if len(train_set) == 0:
            raise UserError(f"train_mtp: no usable training sequence in '{cfg.responses}' (responses empty?)")

        target = build_target(cfg.target, ctx.device)
        model = target.model
        dtype = getattr(torch, cfg.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise UserError(f"train_mtp.dtype '{cfg.dtype}' is not a torch dtype name (float32, bfloat16...)")
        if cfg.init_from:
            head = load_head(model, cfg.init_from, device=target.device, dtype=dtype, recurse=cfg.recurse)
        else:
            spec = MTPSpec(mlp=cfg.mlp, intermediate_size=cfg.intermediate_size, recurse=cfg.recurse)
            head = build_head(model, model.config, spec, device=target.device, dtype=dtype)
        head.train().requires_grad_(True)
        for name, param in head.named_parameters():  # copies of the target's head/embedding stay frozen
            if name.startswith(("shared_head.head.", "embed_tokens.")):
                param.requires_grad_(False)
        module = MTPTrainModule(head, model, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                warmup_steps=cfg.warmup_steps, min_lr_ratio=cfg.min_lr_ratio,
                                ce_weight=cfg.ce_weight, kl_weight=cfg.kl_weight, depths=cfg.depths,
                                depth_decay=cfg.depth_decay)
        loader = lambda data, shuffle: torch.utils.data.DataLoader(  # noqa: E731
            data, batch_size=cfg.batch_size, shuffle=shuffle, collate_fn=collate_responses,
            num_workers=cfg.num_workers)
        ckpt_dir = out / "checkpoints"
        ckpt = ModelCheckpoint(dirpath=str(ckpt_dir), save_top_k=0, save_last=True,
                               enable_version_counter=False,
                               every_n_train_steps=max(1, cfg.checkpoint_every_n_steps))
        mlf = mlflow_logger(ctx, "train_mtp", tags={"specmoe.stage": "train_mtp"})
        trainer = build_trainer(opts, out / "lightning", callbacks=[ckpt], logger=mlf)
        resume = ckpt_dir / "last.ckpt"
        t0 = time.perf_counter()
        trainer.fit(module, loader(train_set, True), loader(val_set, False) if len(val_set) else None,
                    ckpt_path=str(resume) if resume.is_file() else None)
        seconds = time.perf_counter() - t0
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        hist = module.loss_history
        summary = {"steps": int(trainer.global_step), "train_sequences": len(train_set),
                   "val_sequences": len(val_set), "train_seconds": round(seconds, 2),
                   "first_loss": _mean(hist[:10]), "last_loss": _mean(hist[-10:]), **metrics,
                   "spec": head.spec.to_dict()}
        if trainer.is_global_zero:
            export_head(module.head, model, out, extra={"steps": summary["steps"], "depths": cfg.depths})
        return summary


def _mean(xs: list[float]) -> Optional[float]:
    return round(sum(xs) / len(xs), 5) if xs else None
