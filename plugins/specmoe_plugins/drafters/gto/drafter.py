# SPDX-License-Identifier: Apache-2.0
"""``gto``: an EAGLE-3 draft fine-tuned with Group Tree Optimization (``train_gto``).

GTO changes only the training objective, so the draft is an EAGLE-3 network in the released EAGLE-3 format
and drafting is the ``eagle3`` drafter's, reached through the registry; this name exists so that recipes and
result tables can tell the two apart. Options as ``eagle3``.
"""

from __future__ import annotations

from specmoe.registry import drafters

__all__ = ["GTODrafter"]


class GTODrafter(drafters.get("eagle3")):
    """EAGLE-3 drafting with a GTO-trained draft (same checkpoint format)."""

    description = "GTO-fine-tuned EAGLE-3 draft (EAGLE-3 checkpoint format), EAGLE-2/3 dynamic tree"

    def _name(self) -> str:
        return "gto"
