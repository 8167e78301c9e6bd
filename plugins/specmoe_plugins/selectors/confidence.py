# SPDX-License-Identifier: Apache-2.0
"""``confidence``: the EAGLE-2/3 baseline, the root plus the gamma - 1 nodes of highest path value.

The value is calibrated by default (``calibrated: true``): the engine's online estimate of the probability that
the node's path is accepted (:mod:`specmoe.decoding.node_values`), which equals P(path) for a calibrated draft.
``calibrated: false`` ranks by the draft's raw P(path), as EAGLE-2/3 and the paper do (the ablation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specmoe.decoding.selection import top_closed, whole_pool
from specmoe.interfaces.selector import Selector
from specmoe.interfaces.tree import DraftTree

__all__ = ["ConfidenceSelector"]


class ConfidenceSelector(Selector):
    """Top gamma - 1 nodes by path value (calibrated, or the raw cumulative draft probability).

    A child's value never exceeds its parent's, so the top set is ancestor-closed; ties are broken towards
    shallower nodes (then lower index), which keeps closure when values are equal. No loop over the picks
    (:func:`~specmoe.decoding.selection.top_closed`: plain Python for a small CPU pool, otherwise a fixed set of
    tensor operations with no host read).
    """

    description = "EAGLE-2/3 baseline: highest path value (calibrated acceptance; raw P(path) when calibrated: false)"

    @dataclass
    class Config:
        calibrated: bool = True
        """rank by the engine's calibrated node values (true) or by the draft's raw P(path) (false: EAGLE-2/3
        and the paper, for the ablation)."""

    @property
    def node_values(self) -> bool:
        return bool(self.config.calibrated)

    def select(self, tree: DraftTree, budget: int, experts: torch.Tensor | None = None,
               buffer: torch.Tensor | None = None) -> torch.Tensor:
        whole = whole_pool(tree, budget)
        if whole is not None:
            return whole
        logv = tree.path_logp if not self.config.calibrated or tree.value is None else tree.value.log()
        return top_closed(tree, logv, budget)
