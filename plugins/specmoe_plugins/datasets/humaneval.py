# SPDX-License-Identifier: Apache-2.0
"""``humaneval``: 164 Python problems; the prompt is the benchmark's own (signature + docstring), as is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specmoe.data.base import BenchmarkDataset
from specmoe.interfaces.dataset import Sample

__all__ = ["HumanEval"]


class HumanEval(BenchmarkDataset):
    """OpenAI HumanEval (``HumanEval.jsonl.gz``, read with gzip); a raw code-completion prompt per task."""

    description = "HumanEval code completion, benchmark prompts as is (paper App. E)"
    key = "humaneval"
    files = {"test": "humaneval/HumanEval.jsonl.gz"}
    hub_repo = "openai/openai_humaneval"
    hub_files = {"test": "openai_humaneval/test-00000-of-00001.parquet"}
    default_chat = False

    @dataclass
    class Config(BenchmarkDataset.Config):
        pass

    def to_sample(self, index: int, rec: dict[str, Any]) -> Sample:
        """``turns[0]`` = ``prompt``; the reference is the canonical solution (body), tests in ``meta``."""
        task_id = str(self.field(rec, index, "task_id"))
        return Sample(id=task_id, turns=[self.field(rec, index, "prompt")], chat=self.chat,
                      reference=rec.get("canonical_solution"),
                      meta={"index": index, "entry_point": rec.get("entry_point"), "test": rec.get("test")})
