# SPDX-License-Identifier: Apache-2.0
"""``mmstar``: MMStar's 1500 questions as text only (no images), as in the paper's text-only workload.

The prompt is the question text with its options (``"...\\nOptions: A: ..., B: ..., ..."``), nothing else.
Read from ``mmstar/mmstar_text.jsonl`` (derived from the official example submission) or the hub's
``mmstar.parquet`` (its ``image`` column is never read). Excel's ``_x005F_x000D_`` escape, left in two local
questions, is turned back into the carriage return it stands for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specmoe.data.base import BenchmarkDataset
from specmoe.interfaces.dataset import Sample

__all__ = ["MMStar"]

_EXCEL_CR = "_x005F_x000D_"


class MMStar(BenchmarkDataset):
    """MMStar ``val`` split (1500 multiple-choice questions), text only; a chat prompt by default."""

    description = "MMStar questions without images (text-only workload, paper App. E)"
    key = "mmstar"
    files = {"val": "mmstar/mmstar_text.jsonl"}
    hub_repo = "Lin-Chen/MMStar"
    hub_files = {"val": "mmstar.parquet"}
    drop_columns = ("image",)
    default_chat = True

    @dataclass
    class Config(BenchmarkDataset.Config):
        split: str = "val"
        """MMStar has a single split, ``val``."""

    def to_sample(self, index: int, rec: dict[str, Any]) -> Sample:
        """The reference is the gold option letter; ``prediction`` (a model's output) is dropped."""
        question = str(self.field(rec, index, "question")).replace(_EXCEL_CR, "\r")
        meta_info = rec.get("meta_info") if isinstance(rec.get("meta_info"), dict) else {}
        bench = rec.get("bench", meta_info.get("source"))  # local copy: `bench`; hub: `meta_info.source`
        return Sample(id=self.sample_id(rec.get("index", index)), turns=[question], chat=self.chat,
                      reference=str(self.field(rec, index, "answer")).strip(),
                      meta={"index": index, "category": rec.get("category"),
                            "l2_category": rec.get("l2_category"), "bench": bench})
