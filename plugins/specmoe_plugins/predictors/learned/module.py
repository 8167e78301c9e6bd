# SPDX-License-Identifier: Apache-2.0
"""The learned expert predictor of paper §4.1 as a ``LightningModule``, and its export from a checkpoint.

The network and the exported directory's loader are in :mod:`.model` (no Lightning).

Network: token ids -> the **target's** frozen input embedding ``[T, H_t]`` -> linear projection to the
backbone width -> a small decoder-only backbone (any Hugging Face causal-LM architecture, fresh from a config
or ``from_pretrained``; its own token embedding is dropped) -> linear head -> ``[T, L, E]`` routing logits.
Position ``i`` predicts the routing of token ``i`` itself given ``t_<i`` (no shift).

The target embedding is a plain attribute, not a parameter or buffer: it is never trained, never saved in
checkpoints or exports (the decoding plugin uses the target's own embedding layer) and never broadcast by
DDP. Exported directory::

    predictor.json      shapes (L, E, K, target hidden/vocab), metrics at export, training step
    config.json         the backbone's transformers config (vocabulary reduced to 1: embedding dropped)
    model.safetensors   projection + backbone + head weights
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import lightning as L
import torch
from torch import nn

from specmoe.training.routing_metrics import TopKRoutingAccuracy, routing_loss
from specmoe_plugins.predictors.learned.model import PREDICTOR_FORMAT, RoutingPredictorNet, build_backbone

__all__ = ["PredictorModule", "export_from_checkpoint"]

class PredictorModule(L.LightningModule):
    """Trains :class:`RoutingPredictorNet` with the layer-wise cross-entropy of eq. 6.

    The loss of a step is the mean over the valid (token, layer) terms of the **global** batch (counts are
    summed across ranks), so N processes with per-device batch b train exactly like one with batch N*b.

    Args:
        num_layers, num_experts, top_k: target routing shape.
        target_hidden: width of the target embedding.
        target_vocab: target vocabulary size (checked when the embedding is attached).
        backbone, backbone_config, attn_implementation: see :func:`build_backbone`.
        lr, weight_decay, betas: AdamW (weight_decay 0 = Adam, the paper's optimizer).
        warmup_steps: linear learning-rate warm-up (0: constant).
        gradient_checkpointing: recompute backbone activations in backward.
    """

    def __init__(self, num_layers: int, num_experts: int, top_k: int, target_hidden: int, target_vocab: int,
                 backbone: Optional[str] = None, backbone_config: Optional[dict[str, Any]] = None,
                 attn_implementation: str = "sdpa", lr: float = 1e-5, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999), warmup_steps: int = 0,
                 gradient_checkpointing: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        body = build_backbone(backbone, backbone_config, attn_implementation)
        if gradient_checkpointing:
            body.gradient_checkpointing_enable()
        self.net = RoutingPredictorNet(body, target_hidden, num_layers, num_experts)
        self.val_acc = TopKRoutingAccuracy(num_layers, top_k)
        from torchmetrics import MeanMetric

        self.val_loss = MeanMetric()
        self.target_embedding: torch.Tensor | None = None  # plain attribute: not saved, not trained

    def set_target_embedding(self, weight: torch.Tensor) -> None:
        """Attach the target's ``[V, H_t]`` input-embedding matrix (frozen)."""
        v, h = weight.shape
        if h != self.hparams.target_hidden or v < self.hparams.target_vocab:
            raise ValueError(f"target embedding {tuple(weight.shape)} does not match the traces' target "
                             f"(vocab {self.hparams.target_vocab}, hidden {self.hparams.target_hidden})")
        self.target_embedding = weight.detach()

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``ids [B, T]`` -> ``[B, T, L, E]`` logits (causal)."""
        w = self.target_embedding
        if w is None:
            raise RuntimeError("PredictorModule: call set_target_embedding() before training or inference")
        if w.device != ids.device:
            w = self.target_embedding = w.to(ids.device)
        return self.net(nn.functional.embedding(ids, w), position_ids=positions)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self(batch["ids"], batch["positions"])
        loss_sum, terms = routing_loss(logits, batch["routing"], batch["valid"])
        world = self.trainer.world_size if self._trainer is not None else 1
        global_terms = terms
        if world > 1:  # tokens of the whole global batch
            global_terms = self.trainer.strategy.reduce(terms.detach().clone(), reduce_op="sum")
        loss = loss_sum / global_terms.clamp(min=1.0) * world
        self.log("train/loss", loss_sum.detach() / terms.clamp(min=1.0), prog_bar=True, on_step=True,
                 on_epoch=False, batch_size=batch["ids"].shape[0])
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        logits = self(batch["ids"], batch["positions"])
        loss_sum, terms = routing_loss(logits, batch["routing"], batch["valid"])
        self.val_acc.update(logits, batch["routing"], batch["valid"])
        if float(terms) > 0:
            self.val_loss.update(loss_sum / terms, weight=terms)

    def on_validation_epoch_end(self) -> None:
        res = self.val_acc.compute()
        metrics = {"val/acc": res["acc"], "val/loss": self.val_loss.compute()}
        for i, a in enumerate(res["acc_per_layer"]):
            metrics[f"val/acc_layer_{i}"] = a
        self.log_dict({k: v.float() for k, v in metrics.items()}, prog_bar=False, sync_dist=False)
        self.val_acc.reset()
        self.val_loss.reset()

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        params = [p for p in self.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=hp.lr, weight_decay=hp.weight_decay, betas=tuple(hp.betas))
        if hp.warmup_steps <= 0:
            return opt
        from specmoe.training.schedules import warmup_schedule

        return {"optimizer": opt, "lr_scheduler": warmup_schedule(opt, hp.warmup_steps)}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["backbone_config_json"] = self.net.backbone.config.to_json_string(use_diff=False)


def export_from_checkpoint(ckpt_path: str | Path, out_dir: str | Path,
                           extra: dict[str, Any] | None = None) -> Path:
    """Write the exported predictor directory from a Lightning checkpoint of :class:`PredictorModule`."""
    from safetensors.torch import save_file

    from specmoe.utils.files import atomic_path

    ckpt = torch.load(str(ckpt_path), map_location="cpu", weights_only=False)
    hp = dict(ckpt["hyper_parameters"])
    state = {k[len("net."):]: v.contiguous() for k, v in ckpt["state_dict"].items() if k.startswith("net.")}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "model.safetensors") as tmp:
        save_file(state, str(tmp))
    (out / "config.json").write_text(ckpt["backbone_config_json"])
    meta = {"format": PREDICTOR_FORMAT, "version": 1,
            **{k: hp[k] for k in ("num_layers", "num_experts", "top_k", "target_hidden", "target_vocab",
                                  "attn_implementation")},
            "global_step": int(ckpt.get("global_step", 0)), "epoch": int(ckpt.get("epoch", 0)),
            **(extra or {})}
    (out / "predictor.json").write_text(json.dumps(meta, indent=1, default=str))
    return out
