# SPDX-License-Identifier: Apache-2.0
"""``mt_bench``: 80 two-turn MT-Bench questions, rendered with the target's chat template.

Each sample has both user turns; generation answers turn 1, then turn 2 with the model's first answer in the
conversation (:func:`specmoe.data.render.render_turn`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specmoe.data.base import BenchmarkDataset
from specmoe.errors import UserError
from specmoe.interfaces.dataset import Sample

__all__ = ["MTBench"]


class MTBench(BenchmarkDataset):
    """FastChat MT-Bench ``question.jsonl`` (8 categories x 10 questions, 2 turns each)."""

    description = "MT-Bench multi-turn chat (2 turns, target chat template)"
    key = "mt_bench"
    files = {"test": "mt_bench/question.jsonl"}
    hub_repo = "HuggingFaceH4/mt_bench_prompts"
    hub_files = {"test": "raw/question.jsonl"}
    default_chat = True

    @dataclass
    class Config(BenchmarkDataset.Config):
        max_turns: int = 2
        """keep only the first ``max_turns`` user turns (1 = single-turn MT-Bench)."""

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        if self.config.max_turns < 1:
            raise UserError(f"dataset mt_bench: `max_turns` must be >= 1, got {self.config.max_turns}")

    def to_sample(self, index: int, rec: dict[str, Any]) -> Sample:
        """``turns`` = the user turns; GPT-4 reference hints (math, reasoning, coding) go in ``meta``."""
        turns = self.field(rec, index, "turns", "prompt")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise UserError(f"dataset mt_bench: record {index} of {self.source}: `turns` must be a "
                            f"non-empty list of strings")
        refs = [r for r in (rec.get("reference") or []) if r]
        return Sample(id=self.sample_id(rec.get("question_id", index)),
                      turns=list(turns[:self.config.max_turns]),
                      chat=self.chat, reference=None,
                      meta={"index": index, "category": rec.get("category"), "reference_turns": refs or None})
