# SPDX-License-Identifier: Apache-2.0
"""``train_gto``: Group Tree Optimization fine-tuning of an EAGLE-3 draft (GTO, arXiv 2509.22134).

Starts from an EAGLE-3 draft (``drafter: "stage:eagle3"`` or any EAGLE-3 checkpoint), which also serves as the
frozen reference of the debiased reward, and trains ``L_token + omega * L_GTO``
(:class:`~specmoe_plugins.drafters.gto.module.GTOModule`) on the same kind of data as ``train_eagle3``. The output
directory has the ``train_eagle3`` layout and loads as ``{name: gto, path: "stage:<id>"}`` (or ``eagle3``).

The stage is the ``train_eagle3`` stage (reached through the registry) with another starting draft and another
LightningModule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specmoe.errors import UserError
from specmoe.registry import stages

__all__ = ["TrainGTO"]

#: the EAGLE-3 training stage this one specializes
TrainEagle3 = stages.get("train_eagle3")


class TrainGTO(TrainEagle3):
    """GTO fine-tuning against the frozen starting draft."""

    description = "GTO fine-tuning of an EAGLE-3 draft (tree reward, group advantages, PPO-clip)"
    version = "1"
    distributed = True  # Lightning DDP under torchrun / SLURM: every rank trains, rank 0 exports

    @dataclass
    class Config(TrainEagle3.Options):
        drafter: str = ""
        """the starting EAGLE-3 draft (``"stage:<train_eagle3 id>"``, a directory or a hub id); it is also the
        frozen reference."""
        omega: float = 0.5
        """weight of the GTO loss added to the EAGLE-3 loss."""
        clip_eps: float = 0.2
        """PPO clip range (the paper does not state it)."""
        eta: float = 1.0
        """log-sum-exp temperature of the tree reward."""
        delta: float = 1e-6
        """floor added to the group std of the advantages."""
        group_size: int = 8
        """m: adjacent positions per group."""
        num_groups: int = 16
        """K: groups per batch."""
        tree_steps: int = 3
        """levels of the training-time tree (the decoding setting: 3)."""
        tree_top_k: int = 2
        """branching factor of the training-time tree (the decoding setting: 2)."""
        tree_nodes: int = 3
        """non-root nodes kept by the global rerank (gamma - 1 of the decoding setting)."""
        lr: float = 5e-6

    @staticmethod
    def module_class() -> type:
        from specmoe_plugins.drafters.gto.module import GTOModule

        return GTOModule

    @classmethod
    def registry_name(cls) -> str:
        return "train_gto"

    def check(self) -> None:
        cfg = self.config
        if not cfg.drafter:
            raise UserError("train_gto: set 'drafter' to the starting EAGLE-3 draft (e.g. \"stage:eagle3\")")
        if cfg.tree_steps < 1 or cfg.tree_top_k < 1 or cfg.tree_nodes < 1 or cfg.group_size < 2:
            raise UserError("train_gto: tree_steps, tree_top_k, tree_nodes must be >= 1 and group_size >= 2")

    def build_draft(self, target: Any, dataset: Any) -> Any:
        return self.load_draft(self.config.drafter, target).train()

    def build_module(self, draft: Any, layers: list[int], target: Any) -> Any:
        cfg = self.config
        reference = self.load_draft(cfg.drafter, target)  # frozen: the debiased reward's baseline
        return self.module_class()(draft, reference, layers, self.target_factory(),
                                   omega=cfg.omega, clip_eps=cfg.clip_eps, eta=cfg.eta, delta=cfg.delta,
                                   group_size=cfg.group_size, num_groups=cfg.num_groups,
                                   tree_steps=cfg.tree_steps, tree_top_k=cfg.tree_top_k,
                                   tree_nodes=cfg.tree_nodes, seed=cfg.seed, **self.module_options())

    def summary_extra(self, draft: Any) -> dict[str, Any]:
        return {"start": self.config.drafter}
