# SPDX-License-Identifier: Apache-2.0
"""``ecospec``: EcoSpec's cost-aware selection (paper Algorithm 1).

Greedy: score(t) = P(t) / (|E_traj(t) \\ B| + eps), where E_traj(t) is the union of predicted (layer, expert)
pairs on the root-to-t path and B the expert buffer; after each pick B grows by the picked path's experts.
Candidates are limited to nodes whose parent is already selected. By prefix consistency (a child never
scores above its parent under the same buffer) this picks the same nodes as the paper's scan over every
unselected node, up to ties, and the result is ancestor-closed by construction.

Batches. The paper runs Algorithm 1 once per sequence: each row has its own buffer, starting from the
initial buffer ``B0`` (its Appendix A measures batch sizes up to 8 but describes no buffer shared by the batch).
That is the default here (``shared_buffer: false``). ``shared_buffer: true`` is **this project's extension**:
one buffer for the whole batch, rows competing in one greedy sequence, so that a row's picks favour the
experts that other rows already load (the verification pass reads the union over the batch). It changes which
nodes a row verifies depending on the other rows, so it is opt-in. With batch size 1 both are the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specmoe.decoding.selection import greedy_select, path_experts
from specmoe.interfaces.selector import Selector
from specmoe.interfaces.tree import DraftTree

__all__ = ["EcoSpecSelector"]


class EcoSpecSelector(Selector):
    """Marginal expert cost with a dynamic buffer."""

    description = "EcoSpec: P(path) / (|path experts \\ buffer| + eps), greedy with buffer updates"
    needs_experts = True

    @dataclass
    class Config:
        eps: float = 1.0e-6
        shared_buffer: bool = False
        """with batch > 1: ``false`` (default) one buffer per row, the paper's Algorithm 1 run per sequence;
        ``true`` one buffer for the whole batch (this project's extension, not in the paper). The default
        reproduces the paper; identical at batch size 1."""

    def select(self, tree: DraftTree, budget: int, experts: torch.Tensor | None = None,
               buffer: torch.Tensor | None = None) -> torch.Tensor:
        if experts is None:
            raise ValueError("ecospec needs predicted expert sets")
        bsz = tree.batch_size
        paths = path_experts(tree, experts)  # [B, N, L*E]
        shared = self.config.shared_buffer
        rows_of_buf = 1 if shared else bsz
        buf = torch.zeros(rows_of_buf, paths.shape[-1], dtype=torch.bool, device=paths.device)
        if buffer is not None:
            buf |= buffer.reshape(1, -1).to(paths.device)
        prob = tree.path_prob
        eps = self.config.eps

        def score(sel: torch.Tensor) -> torch.Tensor:
            cost = (paths & ~buf[:, None, :]).sum(dim=-1).float()  # [B or 1 -> B, N]
            return prob / (cost + eps)

        def on_pick(rows: torch.Tensor, nodes: torch.Tensor) -> None:
            picked = paths[rows, nodes]  # [P, L*E]
            if shared:
                buf[0] |= picked.any(dim=0)
            else:
                buf[rows] |= picked

        return greedy_select(tree, budget, score, on_pick, joint=shared and bsz > 1)
