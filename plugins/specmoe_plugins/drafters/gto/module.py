# SPDX-License-Identifier: Apache-2.0
"""Group Tree Optimization fine-tuning of an EAGLE-3 draft (``L = L_token + omega * L_GTO``).

Per batch, on top of the EAGLE-3 TTT loss of the ``train_eagle3`` stage's module (reached through the
registry: ``stages.get("train_eagle3").module_class()``, whose ``unroll`` and ``position_trees`` this uses):

1. Pick ``num_groups`` groups of ``group_size`` adjacent response positions
   (:func:`~specmoe_plugins.drafters.gto.objective.choose_groups`).
2. At each picked position build the EAGLE-2 tree (``tree_steps`` levels, ``tree_top_k``, keep the best
   ``tree_nodes``) with the current draft and with the frozen reference draft, from the same context
   (the EAGLE-3 module's ``position_trees`` over the step-0 keys of the TTT pass).
3. Tree reward from target probabilities (log-sum-exp over branches). The target probability of a node at
   depth ``d`` is read from the target's distribution at the data position ``i + d``, i.e. under the data
   prefix (teacher forcing, no extra target pass); it is exact along the accepted path, which is the data path
   when the responses are the target's greedy outputs.
4. Debiased reward ``R = r(current) - r(reference)``, group-standardized advantages, and the PPO-clip
   surrogate on the current tree's longest accepted branch, whose draft log-likelihoods under the current
   and the reference draft are the TTT log-probabilities of the data tokens (the same attention pattern).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch

from specmoe.registry import stages
from specmoe_plugins.drafters.gto.objective import (
    choose_groups,
    clipped_surrogate,
    group_advantages,
    longest_accepted,
    policy_ratio,
    select_top_nodes,
    tree_reward,
)

__all__ = ["GTOModule"]

#: the EAGLE-3 training module (TTT loss, unroll, training-time trees)
Eagle3Module = stages.get("train_eagle3").module_class()


class GTOModule(Eagle3Module):
    """EAGLE-3 training plus the GTO objective against a frozen ``reference`` draft.

    Args:
        reference: the frozen starting draft (not a submodule: never trained or checkpointed).
        omega: weight of the GTO loss (0.5); clip_eps: PPO clip range; eta: reward LSE temperature;
        delta: advantage std floor; group_size, num_groups: groups of adjacent positions per batch;
        tree_steps, tree_top_k, tree_nodes: the training-time tree (levels, branching, kept non-root nodes).
        seed: seeds the choice of groups (with the global step).
        Remaining arguments: see :class:`Eagle3Module`.
    """

    def __init__(self, draft: Any, reference: Any, feature_layers: list[int],
                 target_factory: Optional[Callable[[torch.device], Any]] = None, *, omega: float = 0.5,
                 clip_eps: float = 0.2, eta: float = 1.0, delta: float = 1e-6, group_size: int = 8,
                 num_groups: int = 16, tree_steps: int = 3, tree_top_k: int = 2, tree_nodes: int = 3,
                 seed: int = 0, **kwargs: Any) -> None:
        super().__init__(draft, feature_layers, target_factory, **kwargs)
        self.save_hyperparameters(ignore=["draft", "reference", "target_factory"])
        object.__setattr__(self, "_ref", reference.eval().requires_grad_(False))

    def on_fit_start(self) -> None:
        super().on_fit_start()
        self._ref.to(device=self.device, dtype=self.draft.fc.weight.dtype)

    # ------------------------------------------------------------------ trees
    def _tree(self, model: Any, out: Any, ids: torch.Tensor, valid: torch.Tensor,
              b: torch.Tensor, i: torch.Tensor, tlogits: torch.Tensor, lse: torch.Tensor):
        """Trees at positions ``(b, i)``; returns ``(tree, selected, reward [P])``."""
        hp = self.hparams
        length = ids.shape[1]
        tree = self.position_trees(model, out, ids, b, i, hp.tree_steps, hp.tree_top_k)
        sel = select_top_nodes(tree, hp.tree_nodes)
        t_idx = (i[:, None] + tree.depth).clamp(max=length - 1)
        bb = b[:, None].expand_as(t_idx)
        logp = tlogits[bb, t_idx, tree.tokens] - lse[bb, t_idx]
        ok = valid[bb, t_idx] & (i[:, None] + tree.depth <= length - 1)
        prob = torch.where(ok, logp.exp(), torch.zeros_like(logp))
        return tree, sel, tree_reward(tree, sel, prob, hp.eta)

    @staticmethod
    def _branch_logp(out: Any, ids: torch.Tensor, b: torch.Tensor, i: torch.Tensor,
                     lengths: torch.Tensor, t2d_index: torch.Tensor) -> torch.Tensor:
        """``[P]`` draft log-likelihood of the data tokens ``ids[b, i+2 .. i+1+l]`` (the accepted branch)."""
        total = torch.zeros(b.shape[0], device=ids.device)
        length = ids.shape[1]
        for k in range(1, int(lengths.max().item()) + 1 if lengths.numel() else 1):
            use = lengths >= k
            tok = ids[b, (i + 1 + k).clamp(max=length - 1)]
            did = t2d_index[tok].clamp(min=0)
            lp = torch.log_softmax(out.logits[k - 1][b, i].float(), dim=-1).gather(1, did[:, None]).squeeze(1)
            total = total + torch.where(use, lp, torch.zeros_like(lp))
        return total

    def gto_loss(self, batch: dict[str, torch.Tensor], out: Any, feats: torch.Tensor,
                 tlogits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The GTO surrogate of one batch and its diagnostics."""
        hp = self.hparams
        ids, valid, lmask = batch["input_ids"], batch["valid"], batch["loss_mask"]
        bsz, length = ids.shape
        n = length - 1
        cand = torch.zeros(bsz, n, dtype=torch.bool)
        cand[:, : n - 1] = (lmask & valid)[:, 2:].cpu()
        gen = torch.Generator().manual_seed(int(hp.seed) * 1000003 + int(self.global_step))
        rows, pos = choose_groups(cand, hp.group_size, hp.num_groups, gen)
        zero = tlogits.new_zeros(())
        if rows.shape[0] == 0:
            return zero, {}
        g, m = rows.shape
        b, i = rows.flatten().to(ids.device), pos.flatten().to(ids.device)
        with torch.no_grad():
            ref_out = self.unroll(self._ref, ids, feats, valid, hp.tree_steps)
            lse = torch.logsumexp(tlogits, dim=-1)
            tree, sel, r_cur = self._tree(self.draft, out, ids, valid, b, i, tlogits, lse)
            ref_tree, ref_sel, r_ref = self._tree(self._ref, ref_out, ids, valid, b, i, tlogits, lse)
            d = torch.arange(1, hp.tree_steps + 1, device=ids.device)
            g_idx = i[:, None] + 1 + d
            gold = torch.where((g_idx < length) & valid[b[:, None], g_idx.clamp(max=length - 1)],
                               ids[b[:, None], g_idx.clamp(max=length - 1)], torch.full_like(g_idx, -1))
            acc = longest_accepted(tree, sel, gold)
            acc_ref = longest_accepted(ref_tree, ref_sel, gold)
            adv = group_advantages((r_cur - r_ref).view(g, m), hp.delta).flatten()
            t2d_index = self.draft.target_to_draft()
            logp_ref = self._branch_logp(ref_out, ids, b, i, acc, t2d_index)
        logp_cur = self._branch_logp(out, ids, b, i, acc, t2d_index)
        ratio = policy_ratio(logp_cur, logp_ref, acc)
        loss = clipped_surrogate(ratio, adv, hp.clip_eps)
        logs = {"gto_loss": loss.detach(), "reward": r_cur.mean(), "reward_ref": r_ref.mean(),
                "accept_len": acc.float().mean(), "accept_len_ref": acc_ref.float().mean(),
                "ratio": ratio.detach().mean()}
        return loss, logs

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        hp = self.hparams
        steps = max(hp.ttt_length, hp.tree_steps)
        loss_tok, logs, out, feats, tlogits = self.token_loss(batch, steps)
        gto, glogs = self.gto_loss(batch, out, feats, tlogits)
        loss = loss_tok + hp.omega * gto
        logs.update(glogs)
        self._log(logs, loss, batch)
        return loss
