# SPDX-License-Identifier: Apache-2.0
"""EAGLE-3 training-time test (TTT): the draft unrolled over its own outputs, and the distillation loss.

Indexing (sequence ``x_0 .. x_{L-1}``, target features ``f_t`` and logits ``z_t`` at every position; index
``i`` runs over ``0 .. L-2``):

* step 0, index i: input ``(x_{i+1}, fc(f_i))`` at position ``i``; predicts ``x_{i+2}`` (target ``z_{i+1}``).
* step j, index i: input ``(x_{i+1+j}, h^{j-1}_i)`` at position ``i + j``; predicts ``x_{i+2+j}``
  (target ``z_{i+1+j}``).

Index ``i`` at step ``j`` is the depth-``j`` node of a tree rooted at ``x_{i+1}`` along the data path, and it
attends exactly as that node does at inference (:mod:`specmoe_plugins.drafters.eagle3.tree`): causally to step-0 keys
``<= i`` (the committed context, root included) and to the keys of steps ``1..j`` at the same index (its
ancestors and itself). Positions advance with depth as at inference. (EAGLE / SpecForge keep step positions
fixed and additionally hide the last ``j`` context keys; we keep training identical to inference instead.)

Loss of step j: cross-entropy of the draft against ``softmax(z[..., t2d])`` (the target distribution
restricted to the draft vocabulary) over positions whose predicted token is a response token and whose
target argmax is in the draft vocabulary; steps are weighted ``decay**j`` (0.8 in EAGLE-3 / SpecForge).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specmoe_plugins.drafters.eagle3.model import Eagle3Model

__all__ = ["TTTOutput", "shift", "ttt_loss", "ttt_unroll"]


@dataclass
class TTTOutput:
    """Result of :func:`ttt_unroll` (``N = L - 1`` indices).

    Attributes:
        logits: per step ``[B, N, V_draft]`` float32.
        hidden: per step ``[B, N, H]`` step outputs (pre-norm).
        k0, v0: ``[B, Hkv, N, D]`` step-0 keys / values (the context of trees built at training time).
        valid0: ``[B, N]`` step-0 validity (``x_{i+1}`` is a real token).
    """

    logits: list[torch.Tensor]
    hidden: list[torch.Tensor]
    k0: torch.Tensor
    v0: torch.Tensor
    valid0: torch.Tensor


def shift(x: torch.Tensor, by: int, n: int, fill=0) -> torch.Tensor:
    """``x[:, by : by + n]`` padded at the end with ``fill`` to length ``n``."""
    out = x[:, by:by + n]
    if out.shape[1] < n:
        pad = torch.full((x.shape[0], n - out.shape[1], *x.shape[2:]), fill, dtype=x.dtype, device=x.device)
        out = torch.cat([out, pad], dim=1)
    return out


def _repeat_kv(t: torch.Tensor, rep: int) -> torch.Tensor:
    return t if rep == 1 else t.repeat_interleave(rep, dim=1)


def ttt_unroll(model: Eagle3Model, input_ids: torch.Tensor, features: torch.Tensor, valid: torch.Tensor,
               steps: int, logits: bool = True) -> TTTOutput:
    """Unroll the draft ``steps`` times over a batch of sequences.

    Args:
        input_ids: ``[B, L]``; features: ``[B, L, 3 H_t]`` target features; valid: ``[B, L]`` (right padding).
        logits: also compute each step's draft logits (``False``: ``TTTOutput.logits`` is empty).
    """
    bsz, length = input_ids.shape
    n = length - 1
    dev = input_ids.device
    pos0 = torch.arange(n, device=dev)[None].expand(bsz, n)
    hidden = model.project(features[:, :n])
    valid0 = valid[:, 1:]
    eye = torch.eye(n, dtype=torch.bool, device=dev)
    allowed0 = torch.ones(n, n, dtype=torch.bool, device=dev).tril() & valid0[:, None, :]
    allowed0 = (allowed0 | eye)[:, None]  # [B, 1, N, N]; padding queries see themselves
    neg = torch.finfo(torch.float32).min
    out_logits, outs = [], []
    k0 = v0 = None
    diag_k: list[torch.Tensor] = []
    diag_v: list[torch.Tensor] = []
    for j in range(steps):
        tokens = shift(input_ids, 1 + j, n)
        q, k, v, residual = model.qkv(tokens, hidden, pos0 + j)
        rep = q.shape[1] // k.shape[1]
        if j == 0:
            k0, v0 = k, v
        else:
            diag_k.append(_repeat_kv(k, rep))
            diag_v.append(_repeat_kv(v, rep))
        kk, vv = _repeat_kv(k0, rep), _repeat_kv(v0, rep)
        scores = (q @ kk.transpose(-1, -2)).float() * model.scale
        scores = scores.masked_fill(~allowed0, neg)
        if diag_k:
            d = torch.stack([(q * dk).sum(-1) for dk in diag_k], dim=-1).float() * model.scale  # [B,Hq,N,j]
            scores = torch.cat([scores, d], dim=-1)
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        attn = probs[..., :n] @ vv
        for s, dv in enumerate(diag_v):
            attn = attn + probs[..., n + s, None] * dv
        hidden = model.finish(attn, residual)
        outs.append(hidden)
        if logits:
            out_logits.append(model.logits(hidden))
    return TTTOutput(logits=out_logits, hidden=outs, k0=k0, v0=v0, valid0=valid0)


def ttt_loss(out: TTTOutput, target_logits: torch.Tensor, loss_mask: torch.Tensor, valid: torch.Tensor,
             t2d: torch.Tensor, decay: float = 0.8, steps: int | None = None):
    """Decayed sum of per-step distillation losses.

    Args:
        out: from :func:`ttt_unroll`.
        target_logits: ``[B, L, V]`` the target's logits on the sequence.
        loss_mask: ``[B, L]`` bool, tokens that are trained on (responses).
        valid: ``[B, L]`` bool.
        t2d: ``[V]`` bool draft-vocabulary membership.
        steps: use only the first ``steps`` TTT steps (default: all).

    Returns:
        ``(total, losses, accs, counts)``: the weighted loss and per-step loss / top-1 accuracy / token count
        (accuracies and counts detached).
    """
    length = target_logits.shape[1]
    total = target_logits.new_zeros(())
    losses, accs, counts = [], [], []
    for j, lg in enumerate(out.logits[:steps]):
        n = length - 2 - j
        if n <= 0:
            break
        z = target_logits[:, 1 + j:1 + j + n]
        mask = (loss_mask & valid)[:, 2 + j:2 + j + n] & t2d[z.argmax(dim=-1)]
        with torch.no_grad():
            p = torch.softmax(z[..., t2d].float(), dim=-1)
        logq = torch.log_softmax(lg[:, :n].float(), dim=-1)
        ce = -(p * logq).sum(dim=-1)
        cnt = mask.sum()
        loss = (ce * mask).sum() / cnt.clamp(min=1)
        total = total + (decay ** j) * loss
        losses.append(loss)
        with torch.no_grad():
            accs.append(((logq.argmax(-1) == p.argmax(-1)) & mask).sum().float() / cnt.clamp(min=1))
        counts.append(cnt)
    return total, losses, accs, counts
