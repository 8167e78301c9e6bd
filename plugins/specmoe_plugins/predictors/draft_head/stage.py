# SPDX-License-Identifier: Apache-2.0
"""``train_draft_head``: train the ``draft_head`` expert predictor, a routing head on the drafter's own node
features, on routing traces (network: :mod:`.model`; training: :mod:`.module`).

The frozen target and drafter run online over the traced text (target hidden states -> the drafter's
teacher-forced node features at tree depths ``1 .. depths``); nothing but the head is stored. Everything runs
through ``lightning.Trainer`` (``trainer:`` options: devices, num_nodes, strategy, precision, accumulation).
Output directory::

    checkpoints/last.ckpt        Lightning checkpoint (a rerun resumes from it)
    checkpoints/final.ckpt       weights at the end of training
    head/                        exported head for the ``draft_head`` predictor (``path: <out>/head``)
    milestones/acc50/ ...        exports at the first validation reaching each accuracy level (Table 9)
    logs/metrics.csv             per-step loss, per-validation accuracy (per depth, per layer)

Validation is on the traces' held-out ``test`` split; ``val/acc`` is the depth-1 top-K routing accuracy.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from specmoe.config.schema import Component, component
from specmoe.errors import UserError
from specmoe.interfaces.stage import Stage, StageContext
from specmoe.training.trainer import OptimizerOptions, TrainerOptions, trainer_key_facts

__all__ = ["TrainDraftHead"]


class TrainDraftHead(Stage):
    """Lightning training of a routing head on drafter features; exports ``head/`` and accuracy milestones."""

    description = "train the draft_head expert predictor (routing head on the drafter's node features)"
    version = "1"
    key_facts = classmethod(trainer_key_facts)  # resolved precision in the cache key
    distributed = True  # Lightning DDP: every rank trains

    @dataclass
    class Config(OptimizerOptions):
        traces: str = ""
        """trace directory (``stage:<collect_traces id>``)."""
        drafter: Optional[Component] = component("drafter", optional=True)
        """(required) the frozen drafter whose features the head reads, as in the methods that will use the
        head: ``{name: eagle3, path: "stage:eagle3"}``."""
        target: Optional[Component] = component("target", optional=True, name_default="hf")
        """the frozen target (``name`` defaults to ``hf``); default: the checkpoint the traces were collected
        on."""
        kind: str = "mlp"
        """``mlp``, ``lowrank`` or ``linear`` (full rank; slow at large ``L x E``)."""
        rank: int = 64
        """code width of ``mlp`` / ``lowrank``."""
        use_embedding: bool = True
        """also feed the node token's target embedding."""
        depths: int = 3
        """tree depths trained on (the decoding ``steps``): deeper nodes' features come from drafter states
        fed on the drafter's own outputs."""
        max_len: int = 2048
        """window in tokens (the teacher passes see one window: keep whole traced samples in one)."""
        batch_size: int = 8
        """per-device batch size (global = batch_size x devices x nodes)."""
        val_batch_size: Optional[int] = None
        lr: float = 2e-3
        cache_features: bool = False
        """keep every window's features in host memory after their first computation (later epochs skip
        the target and drafter; windows x tokens x F x depths x 4 bytes per rank)."""
        num_workers: int = 0
        seed: int = 0
        milestones: list[float] = field(default_factory=lambda: [0.5, 0.6])
        """export the first checkpoint whose held-out accuracy reaches each level (paper Table 9)."""
        checkpoint_every_n_steps: Optional[int] = None
        """also write ``last.ckpt`` every this many optimizer steps (default: at each validation)."""
        trainer: TrainerOptions = field(default_factory=lambda: TrainerOptions(max_epochs=10))
        """Lightning options."""

    def _check(self) -> None:
        cfg = self.config
        if not cfg.traces:
            raise UserError("train_draft_head: set 'traces' (e.g. \"stage:traces\")")
        if cfg.drafter is None:
            raise UserError("train_draft_head: set 'drafter' (the drafter the head will serve, e.g. "
                            "{name: eagle3, path: \"stage:eagle3\"})")
        if cfg.depths < 1:
            raise UserError(f"train_draft_head.depths must be >= 1, got {cfg.depths}")

    def _drafter(self) -> Component:
        from specmoe.stages.options import option_components

        return option_components(self.config, "drafter")[0]

    def _frozen(self, reader: Any) -> tuple[Any, Any]:
        """The target and the drafter set up on it."""
        from specmoe.stages.options import build_option, build_target

        cfg = self.config
        if cfg.target is not None:
            target = build_target(cfg)
        else:
            from specmoe.registry import targets

            path = reader.meta.target.get("path")
            if not path:
                raise UserError("train_draft_head: cannot tell which target the traces come from; set "
                                "'target: {path: ...}'")
            target = targets.get("hf")(path=str(path))
        drafter = build_option(cfg, "drafter")
        drafter.setup(target)
        if drafter.feature_size <= 0:
            raise UserError(f"train_draft_head: drafter '{self._drafter().name}' provides no node features "
                            f"(DraftTree.features); use eagle3, gto, mtp or draft_model")
        m = reader.meta
        if (target.num_moe_layers, target.num_experts, target.top_k) != (m.num_layers, m.num_experts, m.top_k):
            raise UserError(f"train_draft_head: the target ({target.num_moe_layers} MoE layers, "
                            f"{target.num_experts} experts, top-{target.top_k}) is not the one the traces in "
                            f"{cfg.traces} were collected on ({m.num_layers}, {m.num_experts}, top-{m.top_k})")
        return target, drafter

    def run(self, out_dir: Path, ctx: StageContext) -> dict[str, Any]:
        import lightning as L
        import torch
        from lightning.pytorch.callbacks import ModelCheckpoint
        from lightning.pytorch.loggers import CSVLogger

        from specmoe.training.checkpoints import resume_checkpoint
        from specmoe.training.milestones import accuracy_milestones
        from specmoe.training.predictor_data import RoutingTraceDataModule
        from specmoe.training.trainer import build_trainer, mlflow_logger
        from specmoe_plugins.predictors.draft_head.module import DraftHeadModule, export_draft_head

        cfg = self.config
        self._check()
        topts = cfg.trainer if isinstance(cfg.trainer, TrainerOptions) else TrainerOptions(**cfg.trainer)
        out = Path(out_dir)
        L.seed_everything(cfg.seed, workers=True)
        dm = RoutingTraceDataModule(cfg.traces, cfg.max_len, cfg.batch_size, cfg.val_batch_size,
                                    cfg.num_workers, cfg.seed)
        target, drafter = self._frozen(dm.reader)
        m = dm.meta
        head = dict(feature_size=drafter.feature_size, embed_size=target.hidden_size, num_layers=m.num_layers,
                    num_experts=m.num_experts, top_k=m.top_k, kind=cfg.kind, rank=cfg.rank,
                    use_embedding=cfg.use_embedding)
        module = DraftHeadModule(head, cfg.depths, cache_features=cfg.cache_features, **cfg.optimizer())
        with torch.no_grad():
            embedding = target.embed(torch.arange(target.vocab_size, device=target.device)).to("cpu", torch.float32)
        module.attach(target, drafter, embedding)
        comp = self._drafter()
        drafter_info = {"name": comp.name, "options": comp.options, "feature_size": drafter.feature_size}
        export = lambda ckpt, where, extra: export_draft_head(ckpt, where, {**extra, "drafter": drafter_info})  # noqa: E731
        milestones = accuracy_milestones(list(cfg.milestones), out, export)
        callbacks = [ModelCheckpoint(dirpath=out / "checkpoints", save_last=True, save_top_k=0,
                                     every_n_train_steps=cfg.checkpoint_every_n_steps), milestones]
        loggers = [CSVLogger(str(out), name="logs", version="")]
        params = {k: v for k, v in asdict(cfg).items() if k not in ("trainer", "drafter", "target")}
        mlf = mlflow_logger(ctx, "train_draft_head", params)
        if mlf is not None:
            loggers.append(mlf)
        trainer = build_trainer(topts, out, callbacks=callbacks, logger=loggers,
                                use_distributed_sampler=False)  # the DataModule's sampler splits batches
        t0 = time.perf_counter()
        trainer.fit(module, dm, ckpt_path=resume_checkpoint(out / "checkpoints" / "last.ckpt"))
        train_s = time.perf_counter() - t0
        final = out / "checkpoints" / "final.ckpt"
        trainer.save_checkpoint(final, weights_only=True)
        results = trainer.validate(module, datamodule=dm, verbose=False)  # final held-out metrics
        metrics = {k: float(v) for k, v in (results[0] if results else {}).items() if k.startswith("val/")}
        summary = {"val_acc": metrics.get("val/acc"),
                   "val_acc_per_depth": [metrics.get(f"val/acc_d{d}") for d in range(1, cfg.depths + 1)],
                   "val_acc_per_layer": [metrics[f"val/acc_layer_{i}"] for i in range(m.num_layers)
                                         if f"val/acc_layer_{i}" in metrics],
                   "parameters": sum(p.numel() for p in module.net.parameters()),
                   "global_step": trainer.global_step, "epochs": trainer.current_epoch,
                   "train_seconds": round(train_s, 1),
                   "world_size": trainer.world_size, "milestones": milestones.reached,
                   "head": str((out / "head").resolve())}
        if trainer.is_global_zero:
            export(final, out / "head", {"val_acc": summary["val_acc"], "traces": cfg.traces})
            (out / "head" / "training_summary.json").write_text(json.dumps(summary, indent=1))
        trainer.strategy.barrier()
        return summary
