# SPDX-License-Identifier: Apache-2.0
"""``train_gto``: Group Tree Optimization fine-tuning of an EAGLE-3 draft (GTO, arXiv 2509.22134).

Starts from an EAGLE-3 draft (``drafter: "stage:eagle3"`` or any EAGLE-3 checkpoint), which also serves as the
frozen reference of the debiased reward, and trains ``L_token + omega * L_GTO``
(:class:`~specmoe.training.gto_module.GTOModule`) on the same kind of data as ``train_eagle3``. The output
directory has the ``train_eagle3`` layout and loads as ``{name: gto, path: "stage:<id>"}`` (or ``eagle3``).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specmoe.errors import UserError
from specmoe.interfaces.stage import Stage, StageContext
from specmoe.training.trainer import trainer_key_facts
from specmoe_plugins.stages.train_eagle3 import (
    DraftTrainConfig,
    _target_on,
    export,
    last_metrics,
    make_loader,
    trainer_options,
)

__all__ = ["TrainGTO"]


class TrainGTO(Stage):
    """GTO fine-tuning against the frozen starting draft."""

    description = "GTO fine-tuning of an EAGLE-3 draft (tree reward, group advantages, PPO-clip)"
    version = "1"
    key_facts = classmethod(trainer_key_facts)  # resolved precision in the cache key
    distributed = True  # Lightning DDP under torchrun / SLURM: every rank trains, rank 0 exports

    @dataclass
    class Config(DraftTrainConfig):
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

    def run(self, out_dir: Path, ctx: StageContext) -> dict[str, Any]:
        import torch

        from specmoe.drafting.eagle3_io import load_eagle3
        from specmoe.drafting.eagle3_model import capture_indices
        from specmoe.training.eagle3_module import fit_module
        from specmoe.training.gto_module import GTOModule
        from specmoe_plugins.stages.generate_responses import build_target

        cfg = self.config
        if not cfg.drafter:
            raise UserError("train_gto: set 'drafter' to the starting EAGLE-3 draft (e.g. \"stage:eagle3\")")
        if cfg.tree_steps < 1 or cfg.tree_top_k < 1 or cfg.tree_nodes < 1 or cfg.group_size < 2:
            raise UserError("train_gto: tree_steps, tree_top_k, tree_nodes must be >= 1 and group_size >= 2")
        ds, loader = make_loader(cfg)
        target = build_target(cfg.target)
        embed = target.model.get_input_embeddings().weight.detach()
        draft = load_eagle3(cfg.drafter, embed=embed, dtype=torch.float32)
        reference = load_eagle3(cfg.drafter, embed=embed, dtype=torch.float32)
        layers = capture_indices(draft.config.aux_layer_ids, target.num_hidden_layers)
        module = GTOModule(draft.train(), reference, layers, functools.partial(_target_on, dict(cfg.target)),
                           omega=cfg.omega, clip_eps=cfg.clip_eps, eta=cfg.eta, delta=cfg.delta,
                           group_size=cfg.group_size, num_groups=cfg.num_groups, tree_steps=cfg.tree_steps,
                           tree_top_k=cfg.tree_top_k, tree_nodes=cfg.tree_nodes, seed=cfg.seed,
                           ttt_length=cfg.ttt_length, decay=cfg.decay, lr=cfg.lr, betas=tuple(cfg.betas),
                           weight_decay=cfg.weight_decay, warmup_steps=cfg.warmup_steps,
                           min_lr_ratio=cfg.min_lr_ratio)
        module.attach_target(target)
        t0 = time.perf_counter()
        trainer = fit_module(module, loader, trainer_options(cfg.trainer), out_dir, ctx, "train_gto",
                             cfg.save_every)
        summary = {"steps": int(trainer.global_step), "train_seconds": round(time.perf_counter() - t0, 1),
                   "sequences": len(ds), "start": cfg.drafter, "feature_layers": layers,
                   **last_metrics(trainer)}
        return export(module, trainer, Path(out_dir), cfg, target, summary)
