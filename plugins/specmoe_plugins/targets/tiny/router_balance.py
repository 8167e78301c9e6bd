# SPDX-License-Identifier: Apache-2.0
"""Router load balance of a MoE model in training: measure it, keep it balanced, stop when it collapses.

* :class:`ExpertCounter` counts the experts each token was routed to, from forward pre-hooks on every
  ``mlp.experts`` module (``top_k_index [T, K]``): the routing actually executed, whatever the router
  (DeepSeek-V3's group routing included).
* :func:`router_losses`: the Switch-Transformer load-balancing loss computed **per MoE layer** and averaged,
  and the ST-MoE router z-loss. (``transformers``' own ``load_balancing_loss_func`` sums the expert counts of
  all layers before taking the product, so it balances the layers' pooled load, not each layer's.)
* :class:`BiasBalancer`: DeepSeek-V3's auxiliary-loss-free balancing: after each optimizer step, every
  router's own bias moves by ``rate`` towards the under-loaded experts (``+rate`` below the mean load,
  ``-rate`` above). GPT-OSS routers have a bias in their logits; DeepSeek-V3 has
  ``e_score_correction_bias`` for exactly this.
* :func:`balance_stats` / :func:`check_router_collapse`: per-layer statistics and the collapse check.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch

from specmoe.errors import UserError

__all__ = ["RouterCollapseError", "ExpertCounter", "BiasBalancer", "router_losses", "router_bias",
           "balance_stats", "check_router_collapse", "moe_layer_ids"]


class RouterCollapseError(UserError):
    """Most routed tokens of some MoE layer go to a handful of experts, or many experts get none."""


def moe_layer_ids(model: torch.nn.Module) -> list[int]:
    """Indices of the decoder layers that have routed experts (``layer.mlp.experts``)."""
    return [i for i, layer in enumerate(model.model.layers) if hasattr(getattr(layer, "mlp", None), "experts")]


class ExpertCounter:
    """Counts expert assignments ``[L, E]`` with forward pre-hooks on the model's experts modules.

    Counting happens only while :attr:`enabled` is true.
    """

    def __init__(self, model: torch.nn.Module, num_experts: int) -> None:
        layers = model.model.layers
        self.layer_ids = moe_layer_ids(model)
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


def router_losses(router_logits: Sequence[torch.Tensor], top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-layer Switch load-balancing loss and router z-loss, each averaged over the MoE layers.

    Args:
        router_logits: one ``[T, E]`` tensor per MoE layer (``output_router_logits=True``).
        top_k: experts per token.

    Returns:
        ``(aux, z)``: ``aux = mean_l E * sum_e f[l, e] * P[l, e]`` with ``f`` the share of the layer's top-k
        assignments on expert ``e`` (no gradient) and ``P`` its mean router probability (1 when uniform);
        ``z = mean_l mean_t logsumexp(logits[l, t])^2``.
    """
    aux, z = [], []
    for logits in router_logits:
        logits = logits.float()
        n_exp = logits.shape[-1]
        chosen = logits.detach().topk(top_k, dim=-1).indices.reshape(-1)
        frac = torch.bincount(chosen, minlength=n_exp).float() / max(1, chosen.numel())
        aux.append(n_exp * (frac * logits.softmax(-1).mean(0)).sum())
        z.append(torch.logsumexp(logits, dim=-1).square().mean())
    if not aux:
        zero = torch.zeros(())
        return zero, zero
    return torch.stack(aux).mean(), torch.stack(z).mean()


def router_bias(mlp: torch.nn.Module) -> Optional[torch.Tensor]:
    """The bias that shifts expert selection in a MoE block: GPT-OSS ``router.bias``, DeepSeek-V3
    ``gate.e_score_correction_bias``; ``None`` when the router has none (Qwen3-MoE)."""
    bias = getattr(getattr(mlp, "router", None), "bias", None)
    if bias is None:
        bias = getattr(getattr(mlp, "gate", None), "e_score_correction_bias", None)
    return bias if isinstance(bias, torch.Tensor) else None


class BiasBalancer:
    """Auxiliary-loss-free load balancing (DeepSeek-V3, §2.1.2) on the routers' own biases.

    The biases are taken out of gradient descent; :meth:`update` moves layer ``l``'s bias of expert ``e`` by
    ``rate * sign(mean_e' load[l, e'] - load[l, e])`` from the assignment counts of the last step.

    Args:
        model: a HF MoE causal LM.
        rate: bias update speed per optimizer step.

    Raises:
        UserError: a MoE layer whose router has no bias.
    """

    def __init__(self, model: torch.nn.Module, rate: float) -> None:
        self.rate = float(rate)
        self.biases: list[torch.Tensor] = []
        for i in moe_layer_ids(model):
            bias = router_bias(model.model.layers[i].mlp)
            if bias is None:
                raise UserError(f"layer {i} of this {model.config.model_type} model has no router bias, so "
                                f"'balance_rate' cannot balance it: set balance_rate: 0 and use "
                                f"'router_aux_loss_coef' in the model config")
            bias.requires_grad_(False)
            self.biases.append(bias)

    @torch.no_grad()
    def update(self, counts: torch.Tensor) -> None:
        """Args: counts: ``[L, E]`` assignments of the step, one row per MoE layer (in layer order)."""
        load = counts.double()
        err = (load.mean(-1, keepdim=True) - load).sign()
        for bias, row in zip(self.biases, err):
            bias.add_(self.rate * row.to(bias.device, bias.dtype))


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
                          max_dead_fraction: float = 1.0, layer_ids: Optional[list[int]] = None,
                          where: str = "") -> list[dict[str, float]]:
    """Raise :class:`RouterCollapseError` when a layer routes most assignments to ``top_k`` experts or leaves
    too many experts without any token.

    A layer has collapsed when the share of its ``top_k`` busiest experts exceeds
    ``u + collapse_fraction * (1 - u)``, with ``u = top_k / E`` the uniform share (E=32, k=4, 0.5: 0.5625;
    0.25: 0.34), or when more than ``max_dead_fraction * E`` of its experts got no token.

    Args:
        counts: ``[L, E]`` assignment counts (see :func:`balance_stats`).
        top_k: experts per token.
        collapse_fraction: how far from uniform (0) towards fully collapsed (1) is tolerated.
        max_dead_fraction: share of experts that may go unused (1: not checked).
        layer_ids: model layer index of each row, for the message.
        where: what was measured, for the message (e.g. ``"validation at step 100"``).

    Returns:
        The :func:`balance_stats` of every layer when nothing collapsed.
    """
    stats = balance_stats(counts, top_k)
    n_exp = counts.shape[1]
    uniform = top_k / n_exp
    limit = uniform + collapse_fraction * (1.0 - uniform)
    max_dead = int(max_dead_fraction * n_exp)
    ids = layer_ids if layer_ids is not None else list(range(len(stats)))
    bad = [(i, s) for i, s in zip(ids, stats)
           if s["tokens"] > 0 and (s["top_k_share"] > limit or s["dead"] > max_dead)]
    if bad and uniform < 1.0:
        detail = "; ".join(f"layer {i}: {s['top_k_share']:.0%} of assignments on its {top_k} busiest "
                           f"experts, {int(s['dead'])} of {n_exp} experts unused" for i, s in bad)
        at = f" at {where}" if where else ""
        raise RouterCollapseError(
            f"router collapse{at} ({detail}; limits: {limit:.0%} on the {top_k} busiest, at most {max_dead} "
            f"unused; uniform {uniform:.0%}): raise 'balance_rate' or 'router_aux_loss_coef' (model config), "
            f"lower the learning rate, or check the data")
    return stats
