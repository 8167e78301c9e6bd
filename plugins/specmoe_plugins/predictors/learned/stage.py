# SPDX-License-Identifier: Apache-2.0
"""``train_predictor``: train the learned expert predictor (paper §4.1, App. B.1) on routing traces.

Everything runs through ``lightning.Trainer`` (``trainer:`` options: devices, num_nodes, strategy ddp/fsdp,
precision, accumulation). Output directory::

    checkpoints/last.ckpt        Lightning checkpoint (a rerun resumes from it, mid-epoch included)
    checkpoints/final.ckpt       weights at the end of training
    predictor/                   exported predictor for the ``learned`` plugin (``path: <out>/predictor``)
    milestones/acc50/ ...        exports at the first validation reaching each accuracy level (Table 9)
    logs/metrics.csv             per-step loss, per-validation accuracy (overall and per layer)

Validation is on the traces' held-out ``test`` split; ``val/acc`` is the top-K routing accuracy.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from specmoe.config.schema import Component, component
from specmoe.errors import UserError
from specmoe.interfaces.stage import Stage, StageContext
from specmoe.training.trainer import OptimizerOptions, TrainerOptions, trainer_key_facts

__all__ = ["TrainPredictor", "resolve_target_embedding"]


def resolve_target_embedding(config: Any, traces_meta: Any):
    """The target's ``[V, H]`` float32 embedding matrix: of the ``target`` option when set (the target is
    loaded), else read from the checkpoint the traces were collected on (without loading the model)."""
    import torch

    from specmoe.training.predictor_data import load_target_embedding

    if config.target is not None:
        from specmoe.stages.options import build_target

        target = build_target(config)
        with torch.no_grad():
            ids = torch.arange(target.vocab_size, device=target.device)
            return target.embed(ids).detach().to("cpu", torch.float32)
    path = traces_meta.target.get("path")
    if not path:
        raise UserError("train_predictor: cannot tell which target the traces come from; "
                        "set 'target: {path: ...}'")
    return load_target_embedding(str(path))


def _weights_sha(net: Any) -> str:
    """Checksum of this rank's weights (replicas must agree under DDP)."""
    import hashlib

    h = hashlib.sha256()
    for k, v in sorted(net.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


class TrainPredictor(Stage):
    """Lightning training of the expert predictor; exports ``predictor/`` and accuracy milestones."""

    description = "train the learned expert predictor (paper 4.1) on routing traces (Lightning, DDP/FSDP)"
    version = "1"
    key_facts = classmethod(trainer_key_facts)  # resolved precision in the cache key
    distributed = True  # Lightning DDP: every rank trains

    @dataclass
    class Config(OptimizerOptions):
        traces: str = ""
        """trace directory (``stage:<collect_traces id>``)."""
        target: Optional[Component] = component("target", optional=True, name_default="hf")
        """the target, only to read its embedding matrix (``name`` defaults to ``hf``); default: the
        checkpoint the traces were collected on."""
        backbone: Optional[str] = None
        """backbone checkpoint or hub id (``Qwen/Qwen3-0.6B``); null: a fresh ``backbone_config``."""
        backbone_config: dict[str, Any] = field(default_factory=dict)
        """config fields (with ``model_type``) for a fresh backbone, or overrides of ``backbone``'s config."""
        attn_implementation: str = "sdpa"
        max_len: int = 512
        """training window in tokens."""
        batch_size: int = 16
        """per-device batch size (global = batch_size x devices x nodes)."""
        val_batch_size: Optional[int] = None
        lr: float = 1e-5
        """the paper's Adam learning rate; fresh tiny backbones want ~1e-3."""
        gradient_checkpointing: bool = False
        num_workers: int = 0
        seed: int = 0
        milestones: list[float] = field(default_factory=lambda: [0.5, 0.6])
        """export the first checkpoint whose held-out accuracy reaches each level (paper Table 9)."""
        checkpoint_every_n_steps: Optional[int] = None
        """also write ``last.ckpt`` every this many optimizer steps (default: at each validation)."""
        trainer: TrainerOptions = field(default_factory=lambda: TrainerOptions(max_epochs=100))
        """Lightning options; the default is the paper's 100 epochs (with ``lr`` 1e-5, batch 16: App. B.1)."""

    def run(self, out_dir: Path, ctx: StageContext) -> dict[str, Any]:
        import lightning as L
        from lightning.pytorch.callbacks import ModelCheckpoint
        from lightning.pytorch.loggers import CSVLogger

        from specmoe.training.checkpoints import resume_checkpoint
        from specmoe.training.milestones import accuracy_milestones
        from specmoe.training.predictor_data import RoutingTraceDataModule
        from specmoe.training.trainer import build_trainer, mlflow_logger
        from specmoe_plugins.predictors.learned.module import PredictorModule, export_from_checkpoint

        cfg = self.config
        if not cfg.traces:
            raise UserError("train_predictor: set 'traces' (e.g. \"stage:traces\")")
        topts = cfg.trainer if isinstance(cfg.trainer, TrainerOptions) else TrainerOptions(**cfg.trainer)
        out = Path(out_dir)
        L.seed_everything(cfg.seed, workers=True)
        dm = RoutingTraceDataModule(cfg.traces, cfg.max_len, cfg.batch_size, cfg.val_batch_size,
                                    cfg.num_workers, cfg.seed)
        m = dm.meta
        module = PredictorModule(m.num_layers, m.num_experts, m.top_k, m.hidden_size, m.vocab_size,
                                 cfg.backbone, cfg.backbone_config, cfg.attn_implementation,
                                 gradient_checkpointing=cfg.gradient_checkpointing, **cfg.optimizer())
        module.set_target_embedding(resolve_target_embedding(cfg, m))
        milestones = accuracy_milestones(list(cfg.milestones), out, export_from_checkpoint)
        callbacks = [ModelCheckpoint(dirpath=out / "checkpoints", save_last=True, save_top_k=0,
                                     every_n_train_steps=cfg.checkpoint_every_n_steps), milestones]
        loggers = [CSVLogger(str(out), name="logs", version="")]
        mlf = mlflow_logger(ctx, "train_predictor", {k: v for k, v in asdict(cfg).items() if k != "trainer"})
        if mlf is not None:
            loggers.append(mlf)
        trainer = build_trainer(topts, out, callbacks=callbacks, logger=loggers,
                                use_distributed_sampler=False)  # the DataModule's sampler splits batches
        last = out / "checkpoints" / "last.ckpt"
        trainer.fit(module, dm, ckpt_path=resume_checkpoint(last))
        final = out / "checkpoints" / "final.ckpt"
        trainer.save_checkpoint(final, weights_only=True)
        results = trainer.validate(module, datamodule=dm, verbose=False)  # final held-out metrics
        metrics = {k: float(v) for k, v in (results[0] if results else {}).items() if k.startswith("val/")}
        summary = {"val_acc": metrics.get("val/acc"), "val_loss": metrics.get("val/loss"),
                   "weights_sha256": _weights_sha(module.net),
                   "val_acc_per_layer": [metrics[f"val/acc_layer_{i}"] for i in range(m.num_layers)
                                         if f"val/acc_layer_{i}" in metrics],
                   "global_step": trainer.global_step, "epochs": trainer.current_epoch,
                   "world_size": trainer.world_size, "milestones": milestones.reached,
                   "predictor": str((out / "predictor").resolve())}
        if trainer.is_global_zero:
            export_from_checkpoint(final, out / "predictor",
                                   {"val_acc": summary["val_acc"], "traces": cfg.traces})
            (out / "predictor" / "training_summary.json").write_text(json.dumps(summary, indent=1))
        trainer.strategy.barrier()
        return summary
