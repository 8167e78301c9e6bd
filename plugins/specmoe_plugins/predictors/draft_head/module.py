# SPDX-License-Identifier: Apache-2.0
"""The ``draft_head`` expert predictor as a ``LightningModule`` (network: :mod:`.model`).

Data are routing-trace windows (:class:`~specmoe.training.predictor_data.RoutingTraceDataModule`: token ids
and the router's top-K per MoE layer). The inputs are computed online from the frozen target and drafter,
never stored on disk: the target's causal pass gives the hidden states the drafter reads
(``Drafter.feature_layers``), then ``Drafter.teacher_features`` gives each position's node feature at tree
depths ``1 .. depths`` (a depth-``d`` node along the text: the drafter fed its own states ``d - 1`` times,
as for the deeper nodes of a draft tree). With ``cache_features`` the features of each window are kept in
memory (CPU) after their first computation, so later epochs skip the target and drafter passes.

Loss: the layer-wise cross-entropy of eq. 6 against uniform mass on the router's top-K (eq. 5), summed over
depths and averaged over the valid (token, layer, depth) terms of the **global** batch. Validation: top-K
overlap per depth (``val/acc_d<d>``); ``val/acc`` and ``val/acc_layer_<l>`` are depth 1 (a node proposed
from committed context: the root and first level, and the held-out accuracy of the other predictors).

The target, the drafter and the target's embedding matrix are plain attributes: never trained, saved in
checkpoints or broadcast by DDP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import lightning as L
import torch
from torch import nn

from specmoe.training.routing_metrics import TopKRoutingAccuracy, routing_loss
from specmoe.training.teacher import teacher_forward
from specmoe_plugins.predictors.draft_head.model import DraftHeadConfig, DraftHeadNet, save_draft_head

__all__ = ["DraftHeadModule", "export_draft_head"]


class DraftHeadModule(L.LightningModule):
    """Trains a :class:`DraftHeadNet` on drafter features of routing-trace windows.

    Args:
        config: the head's shape (:class:`DraftHeadConfig` fields).
        depths: tree depths trained on (``Drafter.teacher_features``).
        lr, weight_decay, warmup_steps: AdamW with linear warm-up.
        cache_features: keep each window's features in memory after the first epoch.
    """

    def __init__(self, config: dict[str, Any], depths: int = 1, lr: float = 1e-3, weight_decay: float = 0.0,
                 warmup_steps: int = 0, cache_features: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = DraftHeadNet(DraftHeadConfig(**config))
        c = self.net.config
        self.val_acc = nn.ModuleList([TopKRoutingAccuracy(c.num_layers, c.top_k) for _ in range(depths)])
        self._frozen: dict[str, Any] = {}  # target, drafter, embedding: not submodules
        self._memo: dict[tuple[str, int], list[torch.Tensor]] = {}

    def attach(self, target: Any, drafter: Any, embedding: torch.Tensor) -> None:
        """The frozen target and drafter (``setup`` on it) and the target's ``[V, H_t]`` input embedding."""
        self._frozen = {"target": target, "drafter": drafter, "embedding": embedding.detach()}

    # ------------------------------------------------------------------ inputs
    @torch.no_grad()
    def features(self, batch: dict[str, torch.Tensor], split: str) -> list[torch.Tensor]:
        """Node features ``[B, T, F]`` of the batch's windows, one per depth (float32, on the batch device)."""
        ids, real = batch["ids"], batch["real"]
        keys = [(split, int(w)) for w in batch["window"]]
        if self.hparams.cache_features and all(k in self._memo for k in keys):
            out = []
            for d in range(self.hparams.depths):
                f = torch.zeros(*ids.shape, self._memo[keys[0]][d].shape[-1], device=ids.device)
                for i, k in enumerate(keys):
                    f[i, :self._memo[k][d].shape[0]] = self._memo[k][d].to(ids.device, torch.float32)
                out.append(f)
            return out
        target, drafter = self._frozen["target"], self._frozen["drafter"]
        hidden = None
        if drafter.feature_layers:
            hidden, _ = teacher_forward(target, ids, real, drafter.feature_layers, target.device, logits=False)
        with torch.autocast(device_type=target.device.type, enabled=False):
            feats = drafter.teacher_features(ids.to(target.device), real.to(target.device), hidden,
                                             self.hparams.depths)
        feats = [f.to(ids.device, torch.float32) for f in feats]
        if self.hparams.cache_features:
            for i, k in enumerate(keys):
                n = int(real[i].sum())
                self._memo[k] = [f[i, :n].to("cpu", copy=True) for f in feats]
        return feats

    def _embeds(self, ids: torch.Tensor) -> Optional[torch.Tensor]:
        if not self.net.config.use_embedding:
            return None
        w = self._frozen["embedding"]
        if w.device != ids.device:
            w = self._frozen["embedding"] = w.to(ids.device)
        return nn.functional.embedding(ids, w)

    def _depth_terms(self, batch: dict[str, torch.Tensor], split: str):
        """Yield ``(depth, logits [B, T, L, E], valid [B, T])`` for every trained depth."""
        feats = self.features(batch, split)
        embeds = self._embeds(batch["ids"])
        t = batch["ids"].shape[1]
        for d, f in enumerate(feats, start=1):
            valid = batch["valid"] & (torch.arange(t, device=f.device) > d)[None]  # a depth-d tree exists
            yield d, self.net(f, embeds), valid

    # ------------------------------------------------------------------ steps
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss_sum, terms = 0.0, 0.0
        for _, logits, valid in self._depth_terms(batch, "train"):
            s, n = routing_loss(logits, batch["routing"], valid)
            loss_sum, terms = loss_sum + s, terms + n
        terms = torch.as_tensor(terms, dtype=torch.float32, device=self.device)
        world = self.trainer.world_size if self._trainer is not None else 1
        global_terms = terms
        if world > 1:  # terms of the whole global batch
            global_terms = self.trainer.strategy.reduce(terms.detach().clone(), reduce_op="sum")
        self.log("train/loss", loss_sum.detach() / terms.clamp(min=1.0), prog_bar=True, on_step=True,
                 on_epoch=False, batch_size=batch["ids"].shape[0])
        return loss_sum / global_terms.clamp(min=1.0) * world

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        for d, logits, valid in self._depth_terms(batch, "val"):
            self.val_acc[d - 1].update(logits, batch["routing"], valid)

    def on_validation_epoch_end(self) -> None:
        metrics = {}
        for d, metric in enumerate(self.val_acc, start=1):
            res = metric.compute()
            metrics[f"val/acc_d{d}"] = res["acc"]
            if d == 1:
                metrics["val/acc"] = res["acc"]
                for i, a in enumerate(res["acc_per_layer"]):
                    metrics[f"val/acc_layer_{i}"] = a
            metric.reset()
        self.log_dict({k: v.float() for k, v in metrics.items()}, prog_bar=False, sync_dist=False)

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        opt = torch.optim.AdamW(self.net.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        if hp.warmup_steps <= 0:
            return opt
        from specmoe.training.schedules import warmup_schedule

        return {"optimizer": opt, "lr_scheduler": warmup_schedule(opt, hp.warmup_steps)}


def export_draft_head(ckpt_path: str | Path, out_dir: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """Write the exported head directory (:func:`.model.save_draft_head`) from a Lightning
    checkpoint of :class:`DraftHeadModule`."""
    ckpt = torch.load(str(ckpt_path), map_location="cpu", weights_only=False)
    hp = dict(ckpt["hyper_parameters"])
    net = DraftHeadNet(DraftHeadConfig(**hp["config"]))
    net.load_state_dict({k[len("net."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("net.")})
    meta = {"depths": hp["depths"], "global_step": int(ckpt.get("global_step", 0)),
            "epoch": int(ckpt.get("epoch", 0)), **(extra or {})}
    return save_draft_head(net, out_dir, meta)

