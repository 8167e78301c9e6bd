# SPDX-License-Identifier: Apache-2.0
"""Lightning training of an MTP head on a frozen target (hidden states and logits computed online).

The slot at position ``p`` pairs the target's final normalized hidden state ``h_p`` with the embedding of
token ``p + 1`` and is trained to predict token ``p + 2`` (see :mod:`specmoe_plugins.drafters.mtp.model`).

Batches are :func:`specmoe.training.response_data.collate_responses` output (``input_ids``, ``valid``,
``loss_mask`` ``[B, T]``; ``loss_mask`` marks response tokens, the labels).

Loss per slot: ``ce_weight * CE(q, token p+2) + kl_weight * H(p_target, q)``, where ``p_target`` is the
target's own distribution of token ``p + 2`` (its logits at position ``p + 1``; the soft term has the
gradient of KL(p_target || q)). Only slots whose label is a response token count.

Optional unrolling (``depths > 1``) reproduces deeper draft levels: at depth ``d`` the slot at ``p`` takes
the head's own depth ``d - 1`` output at slot ``p - 1`` (through ``recurse``) instead of ``h_p``, and
attends to depth-1 keys up to ``p - d + 1`` plus its own chain (one key per earlier depth at ``p - d + j``),
which is what a depth-``d`` tree node sees at inference. Depth losses are weighted ``depth_decay**(d-1)``.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from specmoe.errors import UserError
from specmoe.training.schedules import warmup_schedule
from specmoe.training.teacher import teacher_forward
from specmoe_plugins.drafters.mtp.model import unroll

__all__ = ["MTPTrainModule"]


class MTPTrainModule(L.LightningModule):
    """Trains ``head``; the target is held outside the module's parameters and state dict.

    Args:
        head: an :class:`~specmoe_plugins.drafters.mtp.model.MTPHead` bound to ``target``.
        target: the frozen :class:`~specmoe.interfaces.target.Target`.
        lr, weight_decay, warmup_steps, min_lr_ratio: AdamW (0.9, 0.95) with linear warm-up and cosine decay
            to ``min_lr_ratio * lr`` over the run.
        ce_weight, kl_weight: loss mix (see module docstring).
        depths, depth_decay: unrolled draft depths and their loss decay.
    """

    def __init__(self, head: Any, target: Any, *, lr: float = 1e-3, weight_decay: float = 0.0,
                 warmup_steps: int = 20, min_lr_ratio: float = 0.1, ce_weight: float = 1.0,
                 kl_weight: float = 0.0, depths: int = 1, depth_decay: float = 0.8) -> None:
        super().__init__()
        if depths < 1:
            raise UserError("train_mtp: depths must be >= 1")
        self.head = head
        self._target = [target]  # a list: not registered, not checkpointed, not trained
        self.hp = dict(lr=lr, weight_decay=weight_decay, warmup_steps=warmup_steps, min_lr_ratio=min_lr_ratio,
                       ce_weight=ce_weight, kl_weight=kl_weight, depths=depths, depth_decay=depth_decay)
        self.loss_history: list[float] = []

    @property
    def target(self) -> Any:
        return self._target[0]

    def on_fit_start(self) -> None:
        self.target.to(self.device)

    def _losses(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ids, valid, label = batch["input_ids"], batch["valid"], batch["loss_mask"]
        bsz, t = ids.shape
        hp = self.hp
        feats, logits = teacher_forward(self.target, ids, valid, [-1], ids.device)
        hidden = feats[:, : t - 2]
        t_logits = logits[:, 1: t - 1]  # the target's distribution of token p + 2
        n = t - 2
        slot_ids = ids[:, 1: t - 1]
        labels = ids[:, 2:]
        lmask = label[:, 2:] & valid[:, 2:]
        key_valid = valid[:, 1: t - 1]
        vocab = t_logits.shape[-1]
        p_target = torch.softmax(t_logits.float(), dim=-1) if hp["kl_weight"] else None
        t_top = t_logits.argmax(dim=-1)
        total, weights, logs = 0.0, 0.0, {}
        for d, o in enumerate(unroll(self.head, slot_ids, hidden, key_valid, hp["depths"]), start=1):
            logq = torch.log_softmax(self.head.logits(o)[..., :vocab].float(), dim=-1)
            m = lmask & (torch.arange(n, device=ids.device) >= d - 1)[None]
            cnt = m.sum().clamp(min=1)
            ce = -(logq.gather(-1, labels[..., None])[..., 0] * m).sum() / cnt
            loss = hp["ce_weight"] * ce
            if p_target is not None:
                loss = loss + hp["kl_weight"] * (-(p_target * logq).sum(-1) * m).sum() / cnt
            w = hp["depth_decay"] ** (d - 1)
            total, weights = total + w * loss, weights + w
            top = logq.argmax(dim=-1)
            logs[f"acc_d{d}"] = ((top == labels) & m).sum() / cnt
            logs[f"agree_d{d}"] = ((top == t_top) & m).sum() / cnt
            logs[f"loss_d{d}"] = loss.detach()
        return total / weights, logs

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, logs = self._losses(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        self.log_dict({f"train/{k}": v for k, v in logs.items()}, batch_size=batch["input_ids"].shape[0])
        self.loss_history.append(float(loss.detach()))
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        loss, logs = self._losses(batch)
        bs = batch["input_ids"].shape[0]
        self.log("val/loss", loss, prog_bar=True, batch_size=bs, sync_dist=True)
        self.log_dict({f"val/{k}": v for k, v in logs.items()}, batch_size=bs, sync_dist=True)

    def configure_optimizers(self) -> Any:
        hp = self.hp
        params = [p for p in self.head.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=hp["lr"], betas=(0.9, 0.95), weight_decay=hp["weight_decay"])
        total = self.trainer.estimated_stepping_batches
        warm = min(hp["warmup_steps"], int(total)) if total != float("inf") else hp["warmup_steps"]
        return {"optimizer": opt, "lr_scheduler": warmup_schedule(opt, warm, total, hp["min_lr_ratio"])}
