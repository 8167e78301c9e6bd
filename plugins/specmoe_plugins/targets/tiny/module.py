# SPDX-License-Identifier: Apache-2.0
"""Pretrain a causal MoE LM from a Hugging Face config (Lightning), with a balanced router.

The loss is next-token cross-entropy plus ``router_aux_loss_coef`` (model config) times the per-layer Switch
load-balancing loss and ``router_z_loss_coef`` times the router z-loss; with ``balance_rate > 0`` the routers'
own biases are also balanced without a loss, as in DeepSeek-V3 (:mod:`.router_balance`).
The learning rate follows ``transformers``' cosine-with-minimum schedule after a linear warm-up, over
``trainer.max_steps`` optimizer steps. Every validation measures the per-layer expert load (counted from
forward pre-hooks on every ``mlp.experts`` module, so it is the routing actually executed) and stops
training at the first collapsed check.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional

import lightning as L
import torch

from specmoe_plugins.targets.tiny.router_balance import (
    BiasBalancer,
    ExpertCounter,
    balance_stats,
    check_router_collapse,
    router_bias,
    router_losses,
)

__all__ = ["PretrainLM", "DEFAULT_BALANCE_RATE", "build_hf_config", "num_experts_of", "evaluate_blocks",
           "TRAIN_EXPERTS", "sorted_loop_experts_forward"]

#: router-bias step of the auxiliary-loss-free balancing when ``balance_rate`` is ``None`` (per optimizer step;
#: DeepSeek-V3 used 0.001 over far more steps)
DEFAULT_BALANCE_RATE = 0.01

#: name under which :func:`sorted_loop_experts_forward` is registered in transformers' ``ExpertsInterface``
TRAIN_EXPERTS = "specmoe_sorted_loop"

logger = logging.getLogger(__name__)


def sorted_loop_experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                                top_k_weights: torch.Tensor) -> torch.Tensor:
    """The ``eager`` experts math with a training-friendly backward (any HF experts layout).

    HF's ``eager`` loop indexes ``weight[e]`` once per expert, and each such index backpropagates into a
    zero-filled gradient of the whole ``[E, ...]`` parameter (fill + add per expert: ~40% of a CPU step
    here). This version sorts the (token, slot) pairs by expert once, takes the per-expert token groups with
    one ``split`` and the per-expert weights with one ``unbind`` (one gradient each, instead of a zero-filled
    full-size gradient per slice), and scatters the weighted outputs back with one ``index_add_``.

    Args:
        hidden_states: ``[T, H]``. top_k_index: ``[T, K]`` int64. top_k_weights: ``[T, K]``.

    Returns:
        ``[T, H]`` in ``hidden_states.dtype``.
    """
    n_exp = self.gate_up_proj.shape[0] if self.has_gate else self.up_proj.shape[0]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=n_exp).tolist()[:n_exp]  # ids >= E: expert-parallel sentinels
    token = order // top_k_index.shape[1]
    used = sum(counts)  # the sentinels sort last and are dropped
    parts = hidden_states[token[:used]].split(counts)  # one backward (a cat), not one zero-fill per slice
    up_w = (self.gate_up_proj if self.has_gate else self.up_proj).unbind(0)
    down_w = self.down_proj.unbind(0)
    up_b = down_b = None
    if self.has_bias:
        up_b = (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias).unbind(0)
        down_b = self.down_proj_bias.unbind(0)
    outs = []
    for e, xe in enumerate(parts):
        if counts[e] == 0:
            continue
        h = xe @ up_w[e] if self.is_transposed else torch.nn.functional.linear(xe, up_w[e])
        if up_b is not None:
            h = h + up_b[e]
        h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
        y = h @ down_w[e] if self.is_transposed else torch.nn.functional.linear(h, down_w[e])
        if down_b is not None:
            y = y + down_b[e]
        outs.append(y)
    out = torch.zeros_like(hidden_states)
    if not outs:
        return out
    y = torch.cat(outs) * top_k_weights.reshape(-1)[order[:used], None]
    return out.index_add_(0, token[:used], y.to(out.dtype))


def _register_train_experts() -> None:
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(TRAIN_EXPERTS, sorted_loop_experts_forward)


def build_hf_config(model_config: dict[str, Any]):
    """A ``transformers`` config from a dict holding ``model_type`` (``to_dict()`` output or hand-written)."""
    from transformers import AutoConfig

    cfg = dict(model_config)
    model_type = cfg.pop("model_type", None)
    if not model_type:
        raise ValueError("model_config needs a 'model_type' (e.g. gpt_oss); build one with tiny_config(...)")
    for key in ("transformers_version", "architectures", "_name_or_path"):
        cfg.pop(key, None)
    return AutoConfig.for_model(model_type, **cfg)


def num_experts_of(hf_config: Any) -> int:
    """Routed experts per MoE layer of a GPT-OSS / Qwen3-MoE / DeepSeek-V3 config."""
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        value = getattr(hf_config, key, None)
        if value:
            return int(value)
    raise ValueError(f"config of type '{hf_config.model_type}' names no expert count")


@torch.no_grad()
def evaluate_blocks(model: torch.nn.Module, blocks: torch.Tensor, batch_size: int = 16):
    """Mean next-token loss of ``blocks [N, S]`` and the expert assignment counts on them.

    Returns:
        ``(loss, counts [L, E], layer_ids)``; ``loss`` is ``nan`` without blocks.
    """
    counter = ExpertCounter(model, num_experts_of(model.config))
    counter.enabled = True
    dev = next(model.parameters()).device
    total, n = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(blocks), batch_size):
            ids = blocks[start:start + batch_size].to(dev)
            logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     ids[:, 1:].reshape(-1), reduction="sum")
            total += float(loss)
            n += ids[:, 1:].numel()
    finally:
        counter.remove()
        model.train(was_training)
    return (total / n if n else float("nan")), counter.counts.clone(), counter.layer_ids




class PretrainLM(L.LightningModule):
    """Causal-LM pretraining of a HF MoE model built from ``model_config`` (a config dict).

    Args:
        model_config: HF config dict with ``model_type`` (e.g. ``tiny_config("gpt_oss", ...).to_dict()``);
            its ``router_aux_loss_coef`` weighs the per-layer load-balancing loss.
        lr: peak AdamW learning rate. weight_decay: applied to matrices only (not biases, norms, sinks).
        warmup_steps: linear warm-up; then cosine decay to ``lr * min_lr_ratio`` at ``trainer.max_steps``
            (``transformers.get_cosine_with_min_lr_schedule_with_warmup``).
        betas: AdamW betas.
        router_z_loss_coef: weight of the router z-loss (ST-MoE; 0: off).
        balance_rate: bias update per optimizer step of the auxiliary-loss-free balancing (0: off); the
            router biases then leave gradient descent. ``None``: :data:`DEFAULT_BALANCE_RATE` where every MoE
            layer's router has a bias (GPT-OSS, DeepSeek-V3), else 0 (Qwen3-MoE: the aux loss only).
        collapse_fraction, max_dead_fraction: collapse limits (see ``check_router_collapse``).
        fail_on_collapse: raise at the end of every validation (not the sanity check) when a layer collapsed.
        experts_implementation: HF experts kernel for training; default :data:`TRAIN_EXPERTS` on CPU, HF's
            default (``grouped_mm``) elsewhere.
    """

    def __init__(self, model_config: dict[str, Any], *, lr: float = 2e-3, weight_decay: float = 0.1,
                 warmup_steps: int = 20, min_lr_ratio: float = 0.1, betas: tuple[float, float] = (0.9, 0.95),
                 router_z_loss_coef: float = 0.0, balance_rate: Optional[float] = 0.0,
                 collapse_fraction: float = 0.5,
                 max_dead_fraction: float = 1.0, fail_on_collapse: bool = True,
                 experts_implementation: Optional[str] = None) -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM

        self.save_hyperparameters()
        self.hf_config = build_hf_config(model_config)
        self.model = AutoModelForCausalLM.from_config(self.hf_config, attn_implementation="eager")
        self.aux_coef = float(getattr(self.hf_config, "router_aux_loss_coef", 0.0) or 0.0)
        self.top_k = int(self.hf_config.num_experts_per_tok)
        n_exp = num_experts_of(self.hf_config)
        self.counter = ExpertCounter(self.model, n_exp)  # validation load
        if balance_rate is None:
            layers = self.model.model.layers
            has_bias = all(router_bias(layers[i].mlp) is not None for i in self.counter.layer_ids)
            balance_rate = DEFAULT_BALANCE_RATE if has_bias else 0.0
        self.balance_rate = float(balance_rate)
        self.balancer = BiasBalancer(self.model, balance_rate) if balance_rate > 0 else None
        self.step_counter = ExpertCounter(self.model, n_exp) if self.balancer is not None else None
        self.last_balance: list[dict[str, float]] = []
        self.start_step = 0
        """global step when this run's training started (after a resume: the checkpoint's)."""
        self._val_loss = torch.zeros(2, dtype=torch.float64)

    def on_fit_start(self) -> None:
        _register_train_experts()
        impl = self.hparams.experts_implementation or (TRAIN_EXPERTS if self.device.type == "cpu" else None)
        if impl:
            self.model.set_experts_implementation(impl)

    def on_train_start(self) -> None:
        self.start_step = int(self.trainer.global_step)

    def _step(self, input_ids: torch.Tensor):
        need_router = self.aux_coef > 0 or self.hparams.router_z_loss_coef > 0
        out = self.model(input_ids=input_ids, output_router_logits=need_router, use_cache=False)
        logits = out.logits[:, :-1].float()
        lm = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                               input_ids[:, 1:].reshape(-1))
        if not need_router or not out.router_logits:
            return lm, None, None
        aux, z = router_losses(out.router_logits, self.top_k)
        return lm, aux, z

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.step_counter is not None:
            self.step_counter.enabled = True
        lm, aux, z = self._step(batch["input_ids"])
        if self.step_counter is not None:
            self.step_counter.enabled = False
        loss = lm
        bs = batch["input_ids"].shape[0]
        if aux is not None:
            loss = loss + self.aux_coef * aux + self.hparams.router_z_loss_coef * z
            self.log("train/aux_loss", aux, batch_size=bs)
            self.log("train/z_loss", z, batch_size=bs)
        self.log("train/loss", lm, prog_bar=True, batch_size=bs)
        self.log("train/ppl", torch.exp(lm.detach()), batch_size=bs)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=bs)
        return loss

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        if self.balancer is None:
            return
        counts = self.trainer.strategy.reduce(self.step_counter.counts.to(self.device), reduce_op="sum")
        self.balancer.update(counts.cpu())  # every rank applies the same global update
        self.step_counter.reset()

    def on_validation_epoch_start(self) -> None:
        self.counter.reset()
        self.counter.enabled = True
        self._val_loss.zero_()

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        lm, aux, _ = self._step(batch["input_ids"])
        n = batch["input_ids"][:, 1:].numel()
        self._val_loss += torch.tensor([float(lm) * n, n], dtype=torch.float64)
        if aux is not None:
            self.log("val/aux_loss", aux, batch_size=batch["input_ids"].shape[0])

    def on_validation_epoch_end(self) -> None:
        self.counter.enabled = False
        strategy = self.trainer.strategy
        sums = strategy.reduce(self._val_loss.to(self.device), reduce_op="sum").cpu()
        counts = strategy.reduce(self.counter.counts.to(self.device), reduce_op="sum").cpu()
        if sums[1] > 0:
            val_loss = float(sums[0] / sums[1])
            self.log("val/loss", val_loss, sync_dist=False)
            self.log("val/ppl", math.exp(min(val_loss, 50.0)), sync_dist=False)
        stats = balance_stats(counts, self.top_k)
        for layer, s in zip(self.counter.layer_ids, stats):
            for key in ("top_k_share", "max_load", "entropy", "dead"):
                self.log(f"balance/layer{layer}/{key}", s[key], sync_dist=False)
        self.last_balance = stats
        if not self.trainer.sanity_checking and self.hparams.fail_on_collapse:
            check_router_collapse(counts, self.top_k, collapse_fraction=self.hparams.collapse_fraction,
                                  max_dead_fraction=self.hparams.max_dead_fraction,
                                  layer_ids=self.counter.layer_ids,
                                  where=f"the validation at step {self.trainer.global_step}")

    def configure_optimizers(self):
        from transformers import get_cosine_with_min_lr_schedule_with_warmup

        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            (decay if p.ndim >= 2 and "norm" not in name else no_decay).append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": self.hparams.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=self.hparams.lr,
                                betas=tuple(self.hparams.betas))
        total = max(1, int(self.trainer.estimated_stepping_batches))
        sched = get_cosine_with_min_lr_schedule_with_warmup(
            opt, num_warmup_steps=min(max(0, int(self.hparams.warmup_steps)), total), num_training_steps=total,
            min_lr_rate=float(self.hparams.min_lr_ratio))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
