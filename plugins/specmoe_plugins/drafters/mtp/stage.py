# SPDX-License-Identifier: Apache-2.0
"""``train_mtp``: train a DeepSeek-V3 style MTP head for a target that ships none (or fine-tune one).

Inputs: the target (``hf`` target options; ``path: stage:target`` is substituted by the runner) and a
``generate_responses`` output directory (``responses.jsonl``: ``{"id", "prompt_ids", "response_ids"}``).
The target stays frozen and computes hidden states and logits online. Output: ``out_dir/config.json`` +
``out_dir/model.safetensors`` (keys ``model.layers.{N}.*``), loaded by ``drafter: {name: mtp, path: <dir>}``.
Lightning checkpoints go to ``out_dir/checkpoints`` (``last.ckpt`` is resumed by a re-run), per-step metrics to
``out_dir/logs/version_<n>/metrics.csv`` (and MLflow when tracking is on).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from specmoe.config.schema import Component, component
from specmoe.errors import UserError
from specmoe.interfaces.options import DType, torch_dtype
from specmoe.interfaces.stage import Stage, StageContext
from specmoe.training.trainer import OptimizerOptions, trainer_key_facts

__all__ = ["TrainMTP"]


class TrainMTP(Stage):
    """Train an MTP head on a frozen target's own responses."""

    description = "train a DeepSeek-V3 style MTP drafter head on a frozen target (online hidden states)"
    version = "1"
    key_facts = classmethod(trainer_key_facts)  # resolved precision in the cache key
    distributed = True  # Lightning DDP under torchrun / SLURM: every rank trains, rank 0 exports

    @dataclass
    class Config(OptimizerOptions):
        target: Component = component("target", "hf", options={"path": "stage:target"}, name_default="hf")
        """the frozen target (``name`` defaults to ``hf``)."""
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
        warmup_steps: int = 20
        min_lr_ratio: float = 0.1
        max_prompt_tokens: Optional[int] = None
        """keep at most this many prompt tokens of each sequence (cut from the start)."""
        val_fraction: float = 0.05
        """share of the responses held out for validation (at least one when there are 20 or more)."""
        dtype: DType = DType.float32
        """head parameter dtype (use ``trainer.precision`` for mixed precision)."""
        checkpoint_every_n_steps: int = 200
        num_workers: int = 0
        seed: int = 0
        trainer: dict[str, Any] = field(default_factory=dict)
        """``lightning.Trainer`` options (see :class:`specmoe.training.trainer.TrainerOptions`)."""

    def run(self, out_dir: Path, ctx: StageContext) -> dict[str, Any]:
        import lightning as L

        from specmoe.stages.options import build_target
        from specmoe.training.fit import fit_module, train_metrics
        from specmoe.training.response_data import read_responses, response_loader
        from specmoe.training.trainer import TrainerOptions
        from specmoe_plugins.drafters.mtp.checkpoint import export_head, load_head
        from specmoe_plugins.drafters.mtp.model import MTPSpec, build_head
        from specmoe_plugins.drafters.mtp.module import MTPTrainModule

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
        data = dict(max_length=cfg.max_length, max_prompt_tokens=cfg.max_prompt_tokens, batch_size=cfg.batch_size,
                    seed=cfg.seed, num_workers=cfg.num_workers)
        train_set, train_loader = response_loader(rows[n_val:], shuffle=True, **data)
        val_set, val_loader = response_loader(rows[:n_val], shuffle=False, **data)
        if len(train_set) == 0:
            raise UserError(f"train_mtp: no usable training sequence in '{cfg.responses}' (responses empty?)")

        target = build_target(cfg, device=ctx.device)
        parts = target.parts()
        dtype = torch_dtype(cfg.dtype, where="train_mtp.dtype")
        if cfg.init_from:
            head = load_head(parts, cfg.init_from, device=target.device, dtype=dtype, recurse=cfg.recurse)
        else:
            spec = MTPSpec(mlp=cfg.mlp, intermediate_size=cfg.intermediate_size, recurse=cfg.recurse)
            head = build_head(parts, spec, device=target.device, dtype=dtype)
        head.train().requires_grad_(True)
        for name, param in head.named_parameters():  # copies of the target's head/embedding stay frozen
            if name.startswith(("shared_head.head.", "embed_tokens.")):
                param.requires_grad_(False)
        module = MTPTrainModule(head, target, **cfg.optimizer(), min_lr_ratio=cfg.min_lr_ratio,
                                ce_weight=cfg.ce_weight, kl_weight=cfg.kl_weight, depths=cfg.depths,
                                depth_decay=cfg.depth_decay)
        t0 = time.perf_counter()
        trainer = fit_module(module, train_loader, opts, out, ctx, "train_mtp", cfg.checkpoint_every_n_steps,
                             val_loader=val_loader if len(val_set) else None)
        seconds = time.perf_counter() - t0
        hist = module.loss_history
        summary = {"steps": int(trainer.global_step), "train_sequences": len(train_set),
                   "val_sequences": len(val_set), "train_seconds": round(seconds, 2),
                   "first_loss": _mean(hist[:10]), "last_loss": _mean(hist[-10:]),
                   **train_metrics(trainer, "val/"), "spec": head.spec.to_dict()}
        if trainer.is_global_zero:
            export_head(module.head, parts, out, extra={"steps": summary["steps"], "depths": cfg.depths})
        return summary


def _mean(xs: list[float]) -> Optional[float]:
    return round(sum(xs) / len(xs), 5) if xs else None
