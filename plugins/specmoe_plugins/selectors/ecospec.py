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

The sets are packed into 64-bit words on the host (:class:`~specmoe.decoding.selection.PackedPool`) and each
pick costs a few numpy operations over the current candidates (:func:`~specmoe.decoding.selection.greedy_packed`);
small pools of independent rows (per-row buffers, or batch 1) run the same greedy in plain Python
(:func:`~specmoe.decoding.selection.greedy_scalar`, faster there, see :mod:`specmoe.decoding.selection`). Scores
are float32 in both, as the original torch scores were.

P(t) is the engine's calibrated path value by default (``calibrated: true``, the same values the ``confidence``
baseline ranks by, :mod:`specmoe.decoding.node_values`); ``calibrated: false`` uses the draft's raw path
probability, as the paper does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specmoe.decoding.bitsets import pack_sets
from specmoe.decoding.selection import SCALAR_POOL, PackedPool, ScalarPool, greedy_packed, greedy_scalar, whole_pool
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
        calibrated: bool = True
        """P(path) is the engine's calibrated node value (true) or the draft's raw path probability (false: the
        paper)."""

    @property
    def node_values(self) -> bool:
        return bool(self.config.calibrated)

    def _values(self, tree: DraftTree) -> torch.Tensor:
        return tree.rank_value.float() if self.config.calibrated else tree.path_prob

    def select(self, tree: DraftTree, budget: int, experts: torch.Tensor | None = None,
               buffer: torch.Tensor | None = None) -> torch.Tensor:
        if experts is None:
            raise ValueError("ecospec needs predicted expert sets")
        whole = whole_pool(tree, budget)
        if whole is not None:
            return whole
        b0 = None if buffer is None else pack_sets(buffer.reshape(experts.shape[-2:]))
        eps = np.float32(self.config.eps)
        shared = self.config.shared_buffer
        if (not shared or tree.batch_size == 1) and tree.batch_size * tree.num_nodes <= SCALAR_POOL:
            probs = list(self._values(tree).detach().cpu().numpy())  # [B] rows of np.float32 scalars
            den: dict[int, np.float32] = {}

            def score(r: int, i: int, new: int) -> np.float32:
                d = den.get(new)
                if d is None:
                    d = den[new] = np.float32(new) + eps
                return probs[r][i] / d

            sel = greedy_scalar(ScalarPool.build(tree, experts), budget, score, shape=tuple(tree.tokens.shape),
                                buffer=0 if b0 is None else int.from_bytes(b0.tobytes(), "little"))
            return torch.from_numpy(sel).to(tree.tokens.device)
        pool = PackedPool.build(tree, experts)
        prob = self._values(tree).detach().cpu().numpy().reshape(-1)  # float32, as the torch scores were
        sel = greedy_packed(pool, budget, lambda idx, new: prob[idx] / (new.astype(np.float32) + eps),
                            buffer=b0, shared=shared, joint=shared and tree.batch_size > 1)
        return torch.from_numpy(sel).to(tree.tokens.device)
