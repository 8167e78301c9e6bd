# SPDX-License-Identifier: Apache-2.0
"""Pretrain a causal MoE LM from a Hugging Face config (Lightning), with router load-balance checks.

The loss is next-token cross-entropy plus ``router_aux_loss_coef`` times the model's own auxiliary
load-balancing loss (``output_router_logits=True``). Expert loads are counted from forward pre-hooks on every
``mlp.experts`` module (``top_k_index [T, K]``), so the statistics describe the routing actually executed.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional

import lightning as L
import torch

__all__ = ["PretrainLM", "RouterCollapseError", "build_hf_config", "balance_stats", "check_router_collapse",
           "ExpertCounter", "num_experts_of", "evaluate_blocks", "TRAIN_EXPERTS",
           "sorted_loop_experts_forward"]

#: name under which :func:`sorted_loop_experts_forward` is registered in transformers' ``ExpertsInterface``
TRAIN_EXPERTS = "specmoe_sorted_loop"

logger = logging.getLogger(__name__)


def sorted_loop_experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                                top_k_weights: torch.Tensor) -> torch.Tensor:
    """The ``eager`` experts math with a training-friendly backward (any HF experts layout).

    HF's ``eager`` loop indexes ``weight[e]`` once per expert, and each such index backpropagates into a
    zero-filled gradient of the whole ``[E, ...]`` parameter (fill + add per expert: ~40% of a CPU step
    here). This version sorts the (token, slot) pairs by expert once, takes per-expert views with one
    ``unbind`` (one stacked gradient per parameter) and scatters the weighted outputs back with one
    ``index_add_``.

    Args:
        hidden_states: ``[T, H]``. top_k_index: ``[T, K]`` int64. top_k_weights: ``[T, K]``.

    Returns:
        ``[T, H]`` in ``hidden_states.dtype``.
    """
    n_exp = self.gate_up_proj.shape[0] if self.has_gate else self.up_proj.shape[0]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=n_exp).tolist()
    token = order // top_k_index.shape[1]
    x = hidden_states[token]
    up_w = (self.gate_up_proj if self.has_gate else self.up_proj).unbind(0)
    down_w = self.down_proj.unbind(0)
    up_b = down_b = None
    if self.has_bias:
        up_b = (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias).unbind(0)
        down_b = self.down_proj_bias.unbind(0)
    outs, start = [], 0
    for e in range(n_exp):  # ids >= E (expert-parallel sentinels) sort last and are dropped
        n = counts[e]
        if n == 0:
            continue
        xe = x[start:start + n]
        start += n
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
    y = torch.cat(outs) * top_k_weights.reshape(-1)[order[:start], None]
    return out.index_add_(0, token[:start], y.to(out.dtype))


def _register_train_experts() -> None:
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(TRAIN_EXPERTS, sorted_loop_experts_forward)


class RouterCollapseError(RuntimeError):
    """Most routed tokens of some MoE layer go to a handful of experts."""


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


def balance_stats(counts: torch.Tensor, top_k: int) -> list[dict[str, float]]:
    """Per-layer load statistics of expert assignment counts.

    Args:
        counts: ``[L, E]`` number of (token, slot) assignments per expert and MoE layer.
        top_k: experts per token.

    Returns:
        One dict per layer: ``top_k_share`` (share of assignments on the ``top_k`` busiest experts; uniform:
        ``top_k / E``, collapsed: 1), ``max_load`` (busiest expert's load over the uniform load),
        ``entropy`` (normalised to [0, 1]), ``dead`` (experts never chosen), ``tokens`` (routed tokens).
    """
    out = []
    counts = counts.double()
    n_exp = counts.shape[1]
    for row in counts:
        total = float(row.sum())
        if total <= 0:
            out.append(dict(top_k_share=float("nan"), max_load=float("nan"), entropy=float("nan"),
                            dead=float(n_exp), tokens=0.0))
            continue
        p = row / total
        nz = p[p > 0]
        entropy = float(-(nz * nz.log()).sum() / math.log(n_exp)) if n_exp > 1 else 1.0
        out.append(dict(top_k_share=float(p.sort(descending=True).values[:top_k].sum()),
                        max_load=float(p.max() * n_exp), entropy=entropy, dead=float((row == 0).sum()),
                        tokens=total / top_k))
    return out


def check_router_collapse(counts: torch.Tensor, top_k: int, *, collapse_fraction: float = 0.5,
                          layer_ids: Optional[list[int]] = None) -> list[dict[str, float]]:
    """Raise :class:`RouterCollapseError` when a layer routes most assignments to ``top_k`` experts.

    A layer has collapsed when the share of its ``top_k`` busiest experts exceeds
    ``u + collapse_fraction * (1 - u)``, with ``u = top_k / E`` the uniform share (E=32, k=4: 0.5625).

    Args:
        counts: ``[L, E]`` assignment counts (see :func:`balance_stats`).
        top_k: experts per token.
        collapse_fraction: how far from uniform (0) towards fully collapsed (1) is tolerated.
        layer_ids: model layer index of each row, for the message.

    Returns:
        The :func:`balance_stats` of every layer when nothing collapsed.
    """
    stats = balance_stats(counts, top_k)
    uniform = top_k / counts.shape[1]
    limit = uniform + collapse_fraction * (1.0 - uniform)
    ids = layer_ids if layer_ids is not None else list(range(len(stats)))
    bad = [(i, s) for i, s in zip(ids, stats) if s["tokens"] > 0 and s["top_k_share"] > limit]
    if bad and uniform < 1.0:
        detail = "; ".join(f"layer {i}: {s['top_k_share']:.0%} of assignments on its {top_k} busiest "
                           f"experts, {int(s['dead'])} experts unused" for i, s in bad)
        raise RouterCollapseError(
            f"router collapse ({detail}; limit {limit:.0%}, uniform {uniform:.0%}): raise "
            f"'router_aux_loss_coef' in the model config, lower the learning rate, or check the data")
    return stats


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


class ExpertCounter:
    """Counts expert assignments ``[L, E]`` with forward pre-hooks on the model's experts modules."""

    def __init__(self, model: torch.nn.Module, num_experts: int) -> None:
        layers = model.model.layers
        self.layer_ids = [i for i, layer in enumerate(layers)
                          if hasattr(getattr(layer, "mlp", None), "experts")]
        self.counts = torch.zeros(len(self.layer_ids), num_experts, dtype=torch.long)
        self.enabled = False
        self._handles = [layers[i].mlp.experts.register_forward_pre_hook(self._hook(j))
                         for j, i in enumerate(self.layer_ids)]

    def _hook(self, row: int):
        def hook(module: Any, args: tuple) -> None:
            if self.enabled:
                idx = args[1].reshape(-1)
                idx = idx[idx < self.counts.shape[1]]  # expert-parallel sentinels
                self.counts[row] += torch.bincount(idx.cpu(), minlength=self.counts.shape[1])
        return hook

    def reset(self) -> None:
        self.counts.zero_()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


class PretrainLM(L.LightningModule):
    """Causal-LM pretraining of a HF MoE model built from ``model_config`` (a config dict).

    Args:
        model_config: HF config dict with ``model_type`` (e.g. ``tiny_config("gpt_oss", ...).to_dict()``).
        lr: peak AdamW learning rate. weight_decay: applied to matrices only (not biases, norms, sinks).
        warmup_steps: linear warmup; then cosine decay to ``lr * min_lr_ratio`` at the last step.
        betas: AdamW betas. collapse_fraction: see :func:`check_router_collapse`.
        fail_on_collapse: raise at validation end (not in the sanity check) when a layer collapsed.
        experts_implementation: HF experts kernel for training; default :data:`TRAIN_EXPERTS` on CPU, HF's
            default (``grouped_mm``) elsewhere.
        time_budget_s: training wall-clock budget (the Trainer's ``max_time``). The cosine then follows
            whichever is further along, steps or elapsed time, so a run stopped by the clock before
            ``max_steps`` still ends annealed. Elapsed time comes from Lightning's ``Timer`` (kept across
            resumes). ``None``: steps only.
    """

    def __init__(self, model_config: dict[str, Any], *, lr: float = 2e-3, weight_decay: float = 0.1,
                 warmup_steps: int = 20, min_lr_ratio: float = 0.1, betas: tuple[float, float] = (0.9, 0.95),
                 collapse_fraction: float = 0.5, fail_on_collapse: bool = True,
                 experts_implementation: Optional[str] = None, time_budget_s: Optional[float] = None) -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM

        self.save_hyperparameters()
        self.hf_config = build_hf_config(model_config)
        self.model = AutoModelForCausalLM.from_config(self.hf_config, attn_implementation="eager")
        self.aux_coef = float(getattr(self.hf_config, "router_aux_loss_coef", 0.0) or 0.0)
        self.top_k = int(self.hf_config.num_experts_per_tok)
        self.counter = ExpertCounter(self.model, num_experts_of(self.hf_config))
        self.last_balance: list[dict[str, float]] = []
        self._val_loss = torch.zeros(2, dtype=torch.float64)

    def on_fit_start(self) -> None:
        _register_train_experts()
        impl = self.hparams.experts_implementation or (TRAIN_EXPERTS if self.device.type == "cpu" else None)
        if impl:
            self.model.set_experts_implementation(impl)

    def _step(self, input_ids: torch.Tensor):
        out = self.model(input_ids=input_ids, output_router_logits=self.aux_coef > 0, use_cache=False)
        logits = out.logits[:, :-1].float()
        lm = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                               input_ids[:, 1:].reshape(-1))
        aux = out.aux_loss if isinstance(getattr(out, "aux_loss", None), torch.Tensor) else None
        return lm, aux

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        lm, aux = self._step(batch["input_ids"])
        loss = lm if aux is None else lm + self.aux_coef * aux
        bs = batch["input_ids"].shape[0]
        self.log("train/loss", lm, prog_bar=True, batch_size=bs)
        self.log("train/ppl", torch.exp(lm.detach()), batch_size=bs)
        if aux is not None:
            self.log("train/aux_loss", aux, batch_size=bs)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=bs)
        return loss

    def on_validation_epoch_start(self) -> None:
        self.counter.reset()
        self.counter.enabled = True
        self._val_loss.zero_()

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        lm, aux = self._step(batch["input_ids"])
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
                                  layer_ids=self.counter.layer_ids)

    def _elapsed_s(self) -> float:
        from lightning.pytorch.callbacks import Timer

        for cb in self.trainer.callbacks:
            if isinstance(cb, Timer):
                return float(cb.time_elapsed("train"))
        return 0.0

    def configure_optimizers(self):
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            (decay if p.ndim >= 2 and "norm" not in name else no_decay).append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": self.hparams.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=self.hparams.lr,
                                betas=tuple(self.hparams.betas))
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warm, floor = max(0, int(self.hparams.warmup_steps)), float(self.hparams.min_lr_ratio)

        budget = self.hparams.time_budget_s

        def factor(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            t = (step - warm) / max(1, total - warm)
            if budget:
                t = max(t, self._elapsed_s() / budget)
            t = min(1.0, t)
            return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * t))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
