# SPDX-License-Identifier: Apache-2.0
"""``train_eagle3``: train an EAGLE-3 draft for a target on its regenerated responses (online TTT).

Inputs: the target (``hf`` options) and a ``generate_responses`` output. The draft vocabulary (``d2t`` /
``t2d``) comes from the response-token frequencies; the draft is shaped after the target
(:func:`~specmoe_plugins.drafters.eagle3.init_config`) or continued from an EAGLE-3 checkpoint
(``init_from``). Output (``out_dir``), loadable as ``{name: eagle3, path: "stage:<id>"}`` and servable by
SGLang / vLLM::

    config.json, model.safetensors   the draft in the released EAGLE-3 format
    checkpoints/                     Lightning checkpoints (``last.ckpt`` resumes a killed run)
    logs/version_<n>/metrics.csv     per-step losses / accuracies (also in MLflow when tracking is on)
    summary.json                     losses / accuracies of the last steps, steps, seconds

Multi-GPU / multi-node: the ``trainer`` keys (:class:`~specmoe.training.trainer.TrainerOptions`); each rank
loads the frozen target itself (or use ``target.device_map: auto`` with one process for a target that needs
several GPUs).
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from specmoe.errors import UserError
from specmoe.interfaces.stage import Stage, StageContext
from specmoe.training.trainer import TrainerOptions, trainer_key_facts

__all__ = ["DraftTrainConfig", "TrainEagle3", "last_metrics", "make_loader", "trainer_options"]


@dataclass
class DraftTrainConfig:
    """Options shared by ``train_eagle3`` and ``train_gto``."""

    target: dict[str, Any]
    """``hf`` target options, e.g. ``{path: "stage:target"}``."""
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
    weight_decay: float = 0.0
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    """cosine decay ends at lr * min_lr_ratio."""
    seed: int = 0
    save_every: int = 500
    """optimizer steps between Lightning checkpoints."""
    save_embed_tokens: bool = False
    """write embed_tokens into the exported draft (the serving engines take the target's)."""
    export_dtype: Optional[str] = None
    """dtype of the exported weights (``bfloat16``...); default: the target's."""
    trainer: TrainerOptions = field(default_factory=TrainerOptions)


def trainer_options(value: Any) -> TrainerOptions:
    return value if isinstance(value, TrainerOptions) else TrainerOptions(**dict(value or {}))


def make_loader(cfg: DraftTrainConfig):
    """``(dataset, loader)`` over the responses of ``cfg.data``."""
    import torch

    from specmoe.training.response_data import ResponseDataset, collate_responses, read_responses

    ds = ResponseDataset(read_responses(cfg.data), cfg.max_length, cfg.max_prompt_tokens)
    if len(ds) == 0:
        raise UserError(f"{cfg.data}: no usable training sequences (empty responses or max_length too small)")
    gen = torch.Generator().manual_seed(cfg.seed)
    loader = torch.utils.data.DataLoader(ds, batch_size=cfg.batch_size, shuffle=True, generator=gen,
                                         collate_fn=collate_responses)
    return ds, loader


def last_metrics(trainer: Any) -> dict[str, float]:
    return {k: round(float(v), 5) for k, v in trainer.callback_metrics.items() if k.startswith("train/")}


def _dtype(name: Optional[str], default: Any) -> Any:
    import torch

    if name is None:
        return default
    if not isinstance(getattr(torch, name, None), torch.dtype):
        raise UserError(f"export_dtype '{name}' is not a torch dtype (float32, bfloat16, float16)")
    return getattr(torch, name)


def export(module: Any, trainer: Any, out_dir: Path, cfg: DraftTrainConfig, target: Any,
           summary: dict[str, Any]) -> dict[str, Any]:
    """Write the draft (rank 0) and the summary; returns the summary."""
    from specmoe.drafting.eagle3_io import save_eagle3

    if trainer.is_global_zero:
        save_eagle3(module.draft, out_dir, save_embed_tokens=cfg.save_embed_tokens,
                    dtype=_dtype(cfg.export_dtype, target.dtype))
        (Path(out_dir) / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


class TrainEagle3(Stage):
    """EAGLE-3 draft training with the online frozen target."""

    description = "train an EAGLE-3 draft (TTT, online target features), export in EAGLE-3 format"
    version = "1"
    key_facts = classmethod(trainer_key_facts)  # resolved precision in the cache key
    distributed = True  # Lightning DDP under torchrun / SLURM: every rank trains, rank 0 exports

    @dataclass
    class Config(DraftTrainConfig):
        draft_vocab_size: int = 32000
        """draft vocabulary (capped at the target's); the most frequent response tokens."""
        aux_layer_ids: Optional[list[int]] = None
        """target layers whose outputs are fused (``eagle_aux_hidden_state_layer_ids``); default
        ``[1, L//2 - 1, L - 4]`` (SGLang / SpecForge)."""
        init: dict[str, Any] = field(default_factory=dict)
        """overrides of the draft config shaped after the target (``intermediate_size``,
        ``num_attention_heads``...)."""
        init_from: Optional[str] = None
        """continue from this EAGLE-3 checkpoint (directory or hub id) instead of a fresh draft."""

    def build_draft(self, target: Any, dataset: Any) -> Any:
        import torch

        from specmoe.drafting.eagle3_io import load_eagle3
        from specmoe.drafting.eagle3_model import Eagle3Model
        from specmoe.drafting.vocab_map import build_vocab_map, token_counts
        from specmoe_plugins.drafters.eagle3 import init_config

        cfg = self.config
        embed = target.model.get_input_embeddings().weight.detach()
        if cfg.init_from:
            return load_eagle3(cfg.init_from, embed=embed, dtype=torch.float32)
        counts = token_counts(dataset.response_tokens(), target.vocab_size)
        d2t, t2d = build_vocab_map(counts, min(cfg.draft_vocab_size, target.vocab_size))
        overrides = {"draft_vocab_size": int(d2t.numel()), "aux_layer_ids": cfg.aux_layer_ids, **cfg.init}
        config = init_config(target, **overrides)
        torch.manual_seed(cfg.seed)
        draft = Eagle3Model(config)
        with torch.no_grad():
            draft.embed_tokens.weight.copy_(embed.to("cpu", torch.float32))
            draft.d2t.copy_(d2t)
            draft.t2d.copy_(t2d)
        return draft

    def run(self, out_dir: Path, ctx: StageContext) -> dict[str, Any]:
        from specmoe.drafting.eagle3_model import capture_indices
        from specmoe.training.eagle3_module import Eagle3Module, fit_module
        from specmoe_plugins.stages.generate_responses import build_target

        cfg = self.config
        ds, loader = make_loader(cfg)
        target = build_target(cfg.target)
        draft = self.build_draft(target, ds)
        layers = capture_indices(draft.config.aux_layer_ids, target.num_hidden_layers)
        module = Eagle3Module(draft, layers, functools.partial(_target_on, dict(cfg.target)),
                              ttt_length=cfg.ttt_length, decay=cfg.decay, lr=cfg.lr, betas=tuple(cfg.betas),
                              weight_decay=cfg.weight_decay, warmup_steps=cfg.warmup_steps,
                              min_lr_ratio=cfg.min_lr_ratio)
        module.attach_target(target)
        t0 = time.perf_counter()
        trainer = fit_module(module, loader, trainer_options(cfg.trainer), out_dir, ctx, "train_eagle3",
                             cfg.save_every)
        summary = {"steps": int(trainer.global_step), "train_seconds": round(time.perf_counter() - t0, 1),
                   "sequences": len(ds), "draft_vocab_size": draft.config.draft_vocab_size,
                   "feature_layers": layers, **last_metrics(trainer)}
        return export(module, trainer, Path(out_dir), cfg, target, summary)


def _target_on(options: dict[str, Any], device: Any) -> Any:
    from specmoe_plugins.stages.generate_responses import build_target

    return build_target(options, str(device))
