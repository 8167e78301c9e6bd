# SPDX-License-Identifier: Apache-2.0
"""``generate_responses``: the target's own answers to dataset prompts, the training data of draft models.

Output (``out_dir``)::

    responses.jsonl   {"id", "prompt_ids", "response_ids"} per prompt (appended; a rerun resumes)
    summary.json      counts, tokens, seconds

Prompts are rendered with :func:`specmoe.data.render_prompt` (the target's chat template when the dataset
asks for chat and the tokenizer has one; multi-turn samples contribute their first turn). Decoding is plain
autoregressive (:func:`specmoe.decoding.ar.ar_generate`), greedy at ``temperature: 0``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from specmoe.config.schema import Component, component
from specmoe.errors import UserError
from specmoe.interfaces.stage import Stage, StageContext

__all__ = ["GenerateResponses", "load_prompts"]


def load_prompts(datasets: list[Component], tokenizer: Any, data_dir: Optional[Path] = None,
                 system: Optional[str] = None, max_prompt_tokens: Optional[int] = None):
    """``(items, skipped)``: :class:`~specmoe.training.response_data.PromptItem` per sample of ``datasets``.

    Args:
        datasets: dataset components (``{name: gsm8k, split: train, limit: N, ...}``).
        max_prompt_tokens: prompts longer than this are skipped (counted in ``skipped``).
    """
    from specmoe.data import render_prompt
    from specmoe.data.samples import load_samples
    from specmoe.training.response_data import PromptItem

    if tokenizer is None:
        raise UserError("generate_responses: the target has no tokenizer, so dataset prompts cannot be "
                        "rendered; give the target a 'tokenizer'")
    items, skipped = [], 0
    for sample in load_samples(datasets, "generate_responses.dataset", data_dir):
        ids = render_prompt(tokenizer, sample, system)
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            skipped += 1
            continue
        items.append(PromptItem(sample.id, ids))
    return items, skipped


class GenerateResponses(Stage):
    """Regenerate training responses with the target (self-distillation data for EAGLE-3 / GTO)."""

    description = "the target's own responses to dataset prompts (responses.jsonl), resumable"
    version = "1"

    @dataclass
    class Config:
        target: Component = component("target", name_default="hf")
        """the target (``name`` defaults to ``hf``), e.g. ``{path: "stage:target"}``."""
        dataset: Component = component("dataset")
        """dataset component, e.g. ``{name: gsm8k, split: train, limit: 2000}``."""
        max_new_tokens: int = 512
        temperature: float = 0.0
        """0: greedy (the usual EAGLE-3 regeneration); > 0 samples."""
        batch_size: int = 8
        seed: int = 0
        stop_strings: list[str] = field(default_factory=list)
        ignore_eos: bool = False
        system: Optional[str] = None
        """system prompt for chat-rendered datasets."""
        max_prompt_tokens: Optional[int] = None
        """skip prompts longer than this many tokens."""

    def run(self, out_dir: Path, ctx: StageContext) -> dict[str, Any]:
        from specmoe.decoding.stopping import StopRule
        from specmoe.stages.options import build_target, option_components
        from specmoe.training.response_data import RESPONSES_FILE, write_responses

        cfg = self.config
        target = build_target(cfg, device=getattr(ctx, "device", None))
        datasets = option_components(cfg, "dataset")
        items, skipped = load_prompts(datasets, target.tokenizer, getattr(ctx, "data_dir", None),
                                      cfg.system, cfg.max_prompt_tokens)
        if not items:
            raise UserError("generate_responses: the dataset gave no prompts (check 'dataset' and "
                            "'max_prompt_tokens')")
        stop = StopRule(cfg.max_new_tokens, stop_ids=[] if cfg.ignore_eos else target.eos_token_ids,
                        stop_strings=cfg.stop_strings,
                        tokenizer=target.tokenizer if cfg.stop_strings else None)
        counts = write_responses(target, items, Path(out_dir) / RESPONSES_FILE,
                                 max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, stop=stop,
                                 batch_size=cfg.batch_size, seed=cfg.seed, progress=True)
        summary = {"prompts": len(items), "skipped_long_prompts": skipped, **counts,
                   "dataset": datasets[0].name, "temperature": cfg.temperature}
        (Path(out_dir) / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary
