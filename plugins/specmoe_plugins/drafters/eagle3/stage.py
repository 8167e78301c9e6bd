# SPDX-License-Identifier: Apache-2.0
"""``train_eagle3``: train an EAGLE-3 draft for a target on its regenerated responses (online TTT).

Inputs: the target and a ``generate_responses`` output. The draft vocabulary (``d2t`` / ``t2d``) comes from
the response-token frequencies; the draft is shaped after the target
(:func:`~specmoe_plugins.drafters.eagle3.drafter.init_config`) or continued from an EAGLE-3 checkpoint
(``init_from``). Output (``out_dir``), loadable as ``{name: eagle3, path: "stage:<id>"}`` and servable by
SGLang / vLLM::

    config.json, model.safetensors   the draft in the released EAGLE-3 format
    checkpoints/                     Lightning checkpoints (``last.ckpt`` resumes a killed run)
    logs/version_<n>/metrics.csv     per-step losses / accuracies (also in MLflow when tracking is on)
    summary.json                     losses / accuracies of the last steps, steps, seconds

Multi-GPU / multi-node: the ``trainer`` keys (:class:`~specmoe.training.trainer.TrainerOptions`); each rank
loads the frozen target itself (or use ``target.device_map: auto`` with one process for a target that needs
several GPUs).

Drafts trained differently from the same network (``train_gto``) reuse this stage through the registry:
they subclass :class:`TrainEagle3` (options :attr:`TrainEagle3.Options`, LightningModule
:meth:`TrainEagle3.module_class`) and override :meth:`~TrainEagle3.build_draft` /
:meth:`~TrainEagle3.build_module`.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional

from specmoe.config.schema import Component, component
from specmoe.errors import UserError
from specmoe.interfaces.options import DType, torch_dtype
from specmoe.interfaces.stage import Stage, StageContext
from specmoe.training.trainer import OptimizerOptions, TrainerOptions, trainer_key_facts

__all__ = ["DraftTrainConfig", "TrainEagle3"]


@dataclass(kw_only=True)
class DraftTrainConfig(OptimizerOptions):
    """Options of every EAGLE-3-network training stage (``train_eagle3``, ``train_gto``): the shared optimiser
    options (``lr`` re-declared as 1e-4; keyword-only, as ``target`` and ``data`` have no default)."""

    target: Component = component("target", name_default="hf")
    """the frozen target (``name`` defaults to ``hf``), e.g. ``{path: "stage:target"}``."""
    data: str
    """``generate_responses`` output directory (``"stage:<id>"``)."""
    max_length: int = 2048
    """tokens per training sequence (prompt + response, cut at the end)."""
    max_prompt_tokens: Optional[int] = None
    """keep at most this many prompt tokens (cut from the start); null keeps all."""
    batch_size: int = 1
    ttt_length: int = 7
    """training-time-test unroll steps."""
    decay: float = 0.8
    """loss weight of TTT step j is decay**j."""
    lr: float = 1e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    min_lr_ratio: float = 0.1
    """cosine decay ends at lr * min_lr_ratio."""
    seed: int = 0
    save_every: int = 500
    """optimizer steps between Lightning checkpoints."""
    save_embed_tokens: bool = False
    """write embed_tokens into the exported draft (the serving engines take the target's)."""
    export_dtype: Optional[DType] = None
    """dtype of the exported weights (``bfloat16``...); default: the target's."""
    trainer: TrainerOptions = field(default_factory=TrainerOptions)


def target_on(config: Any, device: Any) -> Any:
    """The stage's target loaded on ``device`` (the factory of ranks that were given no target)."""
    from specmoe.stages.options import build_target

    return build_target(config, device=str(device))


class TrainEagle3(Stage):
    """EAGLE-3 draft training with the online frozen target."""

    description = "train an EAGLE-3 draft (TTT, online target features), export in EAGLE-3 format"
    version = "1"
    key_facts = classmethod(trainer_key_facts)  # resolved precision in the cache key (GTO inherits it)
    distributed = True  # Lightning DDP under torchrun / SLURM: every rank trains, rank 0 exports

    #: the options every EAGLE-3-network training stage shares (subclasses' ``Config`` extend it)
    Options: ClassVar[type] = DraftTrainConfig

    @dataclass
    class Config(DraftTrainConfig):
        draft_vocab_size: int = 32000
        """draft vocabulary (capped at the target's); the most frequent response tokens."""
        aux_layer_ids: Optional[list[int]] = None
        """target hidden-state boundaries fused by the draft (``eagle_aux_hidden_state_layer_ids``, as vLLM reads
        them: ``k`` = output of the first ``k`` layers); default ``[2, L//2, L - 3]`` (the engines' default), or
        three distinct boundaries spread over a shallower target (``[1, 2, 3]`` for 4 layers)."""
        init: dict[str, Any] = field(default_factory=dict)
        """overrides of the draft config shaped after the target (``intermediate_size``,
        ``num_attention_heads``...)."""
        init_from: Optional[str] = None
        """continue from this EAGLE-3 checkpoint (directory or hub id) instead of a fresh draft."""

    @staticmethod
    def module_class() -> type:
        """The LightningModule training an EAGLE-3 network
        (:class:`~specmoe_plugins.drafters.eagle3.module.Eagle3Module`; imported on first use, as it needs
        Lightning)."""
        from specmoe_plugins.drafters.eagle3.module import Eagle3Module

        return Eagle3Module

    # ------------------------------------------------------------------ steps a subclass may override
    def check(self) -> None:
        """Reject bad options before anything is loaded."""

    @staticmethod
    def load_draft(path: str, target: Any) -> Any:
        """A float32 :class:`~specmoe_plugins.drafters.eagle3.model.Eagle3Model` from an EAGLE-3 checkpoint
        (directory or hub id), with the target's embedding where the checkpoint has none."""
        import torch

        from specmoe_plugins.drafters.eagle3.checkpoint import load_eagle3

        return load_eagle3(path, embed=target.parts().embed_tokens.weight.detach(), dtype=torch.float32)

    def build_draft(self, target: Any, dataset: Any) -> Any:
        """The draft to train: shaped after ``target`` with a vocabulary from ``dataset``, or ``init_from``."""
        import torch

        from specmoe_plugins.drafters.eagle3.drafter import init_config
        from specmoe_plugins.drafters.eagle3.model import Eagle3Model
        from specmoe_plugins.drafters.eagle3.vocab_map import build_vocab_map, token_counts

        cfg = self.config
        if cfg.init_from:
            return self.load_draft(cfg.init_from, target)
        counts = token_counts(dataset.response_tokens(), target.vocab_size)
        d2t, t2d = build_vocab_map(counts, min(cfg.draft_vocab_size, target.vocab_size))
        overrides = {"draft_vocab_size": int(d2t.numel()), "aux_layer_ids": cfg.aux_layer_ids, **cfg.init}
        config = init_config(target, **overrides)
        torch.manual_seed(cfg.seed)
        draft = Eagle3Model(config)
        with torch.no_grad():
            draft.embed_tokens.weight.copy_(target.parts().embed_tokens.weight.detach().to("cpu", torch.float32))
            draft.d2t.copy_(d2t)
            draft.t2d.copy_(t2d)
        return draft

    def module_options(self) -> dict[str, Any]:
        """Keyword arguments of :meth:`module_class` beyond the draft, the feature layers and the factory."""
        cfg = self.config
        return dict(ttt_length=cfg.ttt_length, decay=cfg.decay, betas=tuple(cfg.betas), **cfg.optimizer(),
                    min_lr_ratio=cfg.min_lr_ratio)

    def target_factory(self) -> Any:
        """``factory(device) -> target``: how a rank that was given no target loads this stage's target."""
        return functools.partial(target_on, self.config)

    def build_module(self, draft: Any, layers: list[int], target: Any) -> Any:
        """The LightningModule that trains ``draft`` against ``target``."""
        return self.module_class()(draft, layers, self.target_factory(), **self.module_options())

    def summary_extra(self, draft: Any) -> dict[str, Any]:
        """Stage-specific entries of the summary."""
        return {"draft_vocab_size": draft.config.draft_vocab_size}

    # ------------------------------------------------------------------ run
    def run(self, out_dir: Path, ctx: StageContext) -> dict[str, Any]:
        from specmoe.stages.options import build_target
        from specmoe.training.fit import fit_module, train_metrics
        from specmoe.training.response_data import read_responses, response_loader
        from specmoe_plugins.drafters.eagle3.model import capture_indices

        cfg = self.config
        name = self.registry_name()
        self.check()
        ds, loader = response_loader(read_responses(cfg.data), max_length=cfg.max_length,
                                     max_prompt_tokens=cfg.max_prompt_tokens, batch_size=cfg.batch_size,
                                     shuffle=True, seed=cfg.seed)
        if len(ds) == 0:
            raise UserError(f"{name}: no usable training sequences in {cfg.data} (empty responses or "
                            f"max_length too small)")
        target = build_target(cfg)
        draft = self.build_draft(target, ds)
        layers = capture_indices(draft.config.aux_layer_ids, target.num_hidden_layers)
        module = self.build_module(draft, layers, target)
        module.attach_target(target)
        t0 = time.perf_counter()
        opts = cfg.trainer if isinstance(cfg.trainer, TrainerOptions) else TrainerOptions(**dict(cfg.trainer))
        trainer = fit_module(module, loader, opts, out_dir, ctx, name, cfg.save_every)
        summary = {"steps": int(trainer.global_step), "train_seconds": round(time.perf_counter() - t0, 1),
                   "sequences": len(ds), **self.summary_extra(draft), "feature_layers": layers,
                   **train_metrics(trainer)}
        if trainer.is_global_zero:
            from specmoe_plugins.drafters.eagle3.checkpoint import save_eagle3

            save_eagle3(module.draft, out_dir, save_embed_tokens=cfg.save_embed_tokens,
                        dtype=torch_dtype(cfg.export_dtype, target.dtype, where=f"{name}.export_dtype"))
            (Path(out_dir) / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        return summary

    @classmethod
    def registry_name(cls) -> str:
        """The stage's name in messages and MLflow runs."""
        return "train_eagle3"
