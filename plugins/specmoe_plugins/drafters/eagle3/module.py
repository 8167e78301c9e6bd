# SPDX-License-Identifier: Apache-2.0
"""LightningModule training an EAGLE-3 draft with training-time test against a frozen target, online.

The target is not a submodule (it is never optimized, wrapped by DDP or written into checkpoints): every
rank builds or receives its own copy and runs it under ``no_grad`` to get the three captured hidden states and
the logits of each batch (no feature dumps). The draft is unrolled ``ttt_length`` steps
(:func:`~specmoe_plugins.drafters.eagle3.ttt.ttt_unroll`) and trained on the ``0.8**j``-decayed distillation loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import lightning as L
import torch

from specmoe.interfaces.tree import DraftTree
from specmoe.training.schedules import warmup_schedule
from specmoe.training.teacher import teacher_forward
from specmoe_plugins.drafters.eagle3.model import Eagle3Model
from specmoe_plugins.drafters.eagle3.tree import TreeContext, draft_pool
from specmoe_plugins.drafters.eagle3.ttt import TTTOutput, ttt_loss, ttt_unroll

__all__ = ["Eagle3Module"]


class Eagle3Module(L.LightningModule):
    """Trains ``draft`` (an :class:`Eagle3Model`) on batches ``{input_ids, valid, loss_mask}``.

    Args:
        draft: the draft to train (its ``embed_tokens`` stays frozen).
        feature_layers: target ``hidden_states`` indices feeding ``fc``.
        target_factory: builds the frozen target on a device (called on ranks that were given none).
        ttt_length: TTT unroll steps (SpecForge default 7).
        decay: per-step loss weight base (0.8).
        lr, betas, weight_decay, warmup_steps, min_lr_ratio: AdamW with warm-up + cosine decay.
    """

    def __init__(self, draft: Eagle3Model, feature_layers: list[int],
                 target_factory: Optional[Callable[[torch.device], Any]] = None, *, ttt_length: int = 7,
                 decay: float = 0.8, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.95),
                 weight_decay: float = 0.0, warmup_steps: int = 0, min_lr_ratio: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["draft", "reference", "target_factory"])
        self.draft = draft.train().requires_grad_(True)
        self.draft.embed_tokens.weight.requires_grad_(False)
        self.feature_layers = list(feature_layers)
        self._target_factory = target_factory
        object.__setattr__(self, "_target", None)  # not a submodule

    # ------------------------------------------------------------------ the frozen target
    def attach_target(self, target: Any) -> None:
        """Use an already loaded target on this rank (it is moved to the module's device at fit start)."""
        object.__setattr__(self, "_target", target)

    @property
    def target(self) -> Any:
        return self._target

    def on_fit_start(self) -> None:
        if self._target is None:
            if self._target_factory is None:
                raise RuntimeError("Eagle3Module: no target attached and no target_factory given")
            object.__setattr__(self, "_target", self._target_factory(self.device))
        if self._target.device != self.device:
            self._target.to(self.device)
        self.draft.embed_tokens.weight.requires_grad_(False)

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # the frozen embedding is the target's own ([V, H], 2.3 GB in fp32 for GPT-OSS): not checkpointed
        checkpoint["state_dict"].pop("draft.embed_tokens.weight", None)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["state_dict"].setdefault("draft.embed_tokens.weight",
                                            self.draft.embed_tokens.weight.detach().clone())

    # ------------------------------------------------------------------ training
    def token_loss(self, batch: dict[str, torch.Tensor], steps: Optional[int] = None):
        """Teacher pass + TTT unroll + loss; returns ``(loss, logs, out, feats, tlogits)``."""
        ids, valid, loss_mask = batch["input_ids"], batch["valid"], batch["loss_mask"]
        feats, tlogits = teacher_forward(self._target, ids, valid, self.feature_layers, ids.device)
        out = self.unroll(self.draft, ids, feats, valid, steps or self.hparams.ttt_length)
        loss, losses, accs, _ = ttt_loss(out, tlogits, loss_mask, valid, self.draft.t2d, self.hparams.decay,
                                         self.hparams.ttt_length)
        logs = {"loss_token": loss.detach()}
        for j, (lj, aj) in enumerate(zip(losses, accs)):
            logs[f"loss_{j}"] = lj.detach()
            logs[f"acc_{j}"] = aj
        return loss, logs, out, feats, tlogits

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, logs, *_ = self.token_loss(batch)
        self._log(logs, loss, batch)
        return loss

    def _log(self, logs: dict[str, torch.Tensor], loss: torch.Tensor, batch: dict[str, torch.Tensor]) -> None:
        bs = int(batch["input_ids"].shape[0])
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=bs, sync_dist=True)
        self.log_dict({f"train/{k}": v for k, v in logs.items()}, batch_size=bs, sync_dist=True)

    def configure_optimizers(self):
        hp = self.hparams
        params = [p for p in self.draft.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=hp.lr, betas=tuple(hp.betas), weight_decay=hp.weight_decay)
        total = self.trainer.estimated_stepping_batches if self._trainer is not None else None
        return {"optimizer": opt,
                "lr_scheduler": warmup_schedule(opt, hp.warmup_steps, total, hp.min_lr_ratio)}

    # ------------------------------------------------------------------ EAGLE-3 pieces for derived objectives
    @staticmethod
    def unroll(model: Eagle3Model, input_ids: torch.Tensor, features: torch.Tensor, valid: torch.Tensor,
               steps: int) -> TTTOutput:
        """The training-time-test unroll of ``model`` (:func:`~specmoe_plugins.drafters.eagle3.ttt.ttt_unroll`):
        ``input_ids, valid [B, L]``, ``features [B, L, 3 H_t]``."""
        return ttt_unroll(model, input_ids, features.to(model.fc.weight.dtype), valid, steps)

    @staticmethod
    @torch.no_grad()
    def position_trees(model: Eagle3Model, out: TTTOutput, input_ids: torch.Tensor, rows: torch.Tensor,
                       positions: torch.Tensor, steps: int, top_k: int) -> DraftTree:
        """The EAGLE-2/3 candidate pools ``model`` builds at data positions ``(rows, positions)`` ``[P]``.

        Each pool is rooted at token ``input_ids[b, i + 1]`` and sees the step-0 context of ``out`` (an unroll
        of ``model``) up to index ``i``, exactly what inference would see after committing that prefix.

        Returns:
            A :class:`~specmoe.interfaces.tree.DraftTree` of ``P`` rows.
        """
        n = out.k0.shape[2]
        ctx = TreeContext.wrap(out.k0[rows].detach(), out.v0[rows].detach(),
                               (torch.arange(n, device=input_ids.device)[None] <= positions[:, None])
                               & out.valid0[rows], room=max(steps - 1, 0) * top_k)
        root_lp = torch.log_softmax(out.logits[0][rows, positions].detach().float(), dim=-1)
        return draft_pool(model, ctx, input_ids[rows, positions + 1], out.hidden[0][rows, positions].detach(),
                          root_lp, positions, steps, top_k)
