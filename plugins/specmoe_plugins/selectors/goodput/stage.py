# SPDX-License-Identifier: Apache-2.0
"""``calibrate_cost``: the goodput selector's offline cost model, measured on the target and this machine.

Times the target's verification call with forced routing over a grid of batch rows x cached context x tokens
per row x expert-union sizes (:mod:`.calibration`, the code of ``platform bench goodput_cost``), fits
:class:`~.cost_model.CostModel` on part of the calls and
reports its error on the rest; writes ``cost_model.json`` (a goodput selector's ``cost_model:
"stage:<id>/cost_model.json"``). Its result is a measurement of this machine: the CPU / GPU model, torch's thread
count and the target's device and dtype are part of the cache key, so another machine measures its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specmoe.config.schema import Component, component
from specmoe.errors import UserError
from specmoe.interfaces.stage import Stage, StageContext

__all__ = ["CalibrateCost"]


class CalibrateCost(Stage):
    """Forced-routing timing sweep of the target's verification pass -> ``cost_model.json``."""

    description = "measure T_verify over rows x context x tokens x expert unions; fit the goodput cost model"
    version = "1"

    @dataclass
    class Config:
        target: Component = component("target", name_default="hf")
        """the target (``name`` defaults to ``hf``): ``{path: "stage:target"}``."""
        gammas: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
        """verified tokens per row."""
        batches: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
        """rows per call."""
        contexts: list[int] = field(default_factory=lambda: [64, 256, 512])
        """cached tokens per row."""
        unions_per_t: int = 3
        """expert-union sizes per token count (evenly spaced from top_k to the most the tokens can touch)."""
        iters: int = 5
        """timed rounds (every configuration once per round, in a new random order)."""
        warmup: int = 1
        holdout: float = 0.25
        """share of the calls held out of the fit (its error is reported)."""
        features: list[str] = field(default_factory=lambda: ["fixed", "tokens", "expert_layers", "kv_slots"])
        seed: int = 0

    @classmethod
    def key_facts(cls, options: dict[str, Any]) -> dict[str, Any]:
        import torch

        from specmoe.tracking.environment import hardware

        hw = hardware()
        return {"cpu": hw.get("env.hw.cpu"), "gpus": hw.get("env.hw.gpus"), "threads": torch.get_num_threads()}

    def run(self, out_dir: Path, ctx: StageContext) -> dict[str, Any]:
        import datetime

        from specmoe.stages.options import build_target
        from specmoe_plugins.selectors.goodput.calibration import calibrate, fit_split, grid
        from specmoe_plugins.selectors.goodput.cost_model import FEATURES

        cfg = self.config
        bad = [f for f in cfg.features if f not in FEATURES]
        if bad:
            raise UserError(f"calibrate_cost.features: unknown {', '.join(bad)}; choose from {', '.join(FEATURES)}")
        if not 0 < cfg.holdout < 1 or cfg.iters < 1:
            raise UserError(f"calibrate_cost: need 0 < holdout < 1 and iters >= 1 (got {cfg.holdout}, {cfg.iters})")
        target = build_target(cfg, device=ctx.device)
        layers = len(target.moe_layer_ids)
        configs = grid(target.top_k, target.num_experts, cfg.gammas, cfg.batches, cfg.contexts, cfg.unions_per_t)
        records = calibrate(target, configs, iters=cfg.iters, warmup=cfg.warmup, seed=cfg.seed, clock="wall")
        model, train_err, held_err = fit_split(records, layers, list(cfg.features), cfg.holdout, cfg.seed)
        model.meta.update(device=str(target.device), dtype=str(target.dtype), layers=layers,
                          experts=target.num_experts, top_k=target.top_k, clock="wall",
                          **self.key_facts({}),
                          created=datetime.datetime.now().isoformat(timespec="seconds"),
                          fit={"train": train_err, "heldout_calls": held_err})
        model.save(out_dir / "cost_model.json")
        return {"calls": len(records), "configurations": len(configs),
                "coefficients_ms": {k: v * 1e3 for k, v in model.coefficients().items()},
                "heldout_median_abs_rel_error": held_err["median_abs_rel_error"],
                "heldout_p90_abs_rel_error": held_err["p90_abs_rel_error"],
                "train_median_abs_rel_error": train_err["median_abs_rel_error"]}
