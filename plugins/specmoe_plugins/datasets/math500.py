# SPDX-License-Identifier: Apache-2.0
"""``math500``: the 500-problem MATH subset of "Let's Verify Step by Step", with the paper's prompt.

Prompt (Appendix E, shared with ``amc``)::

    Problem:
    {problem}

    Solution:
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specmoe.data.base import BenchmarkDataset
from specmoe.data.templates import problem_solution_prompt
from specmoe.interfaces.dataset import Sample

__all__ = ["MATH500"]


class MATH500(BenchmarkDataset):
    """MATH500 (prm800k ``math_splits/test.jsonl``); a raw completion prompt by default."""

    description = "MATH500, zero-shot 'Problem: ... Solution:' prompt (paper App. E)"
    key = "math500"
    files = {"test": "math500/test.jsonl"}
    hub_repo = "HuggingFaceH4/MATH-500"
    hub_files = {"test": "test.jsonl"}
    default_chat = False

    @dataclass
    class Config(BenchmarkDataset.Config):
        pass

    def to_sample(self, index: int, rec: dict[str, Any]) -> Sample:
        uid = rec.get("unique_id")
        return Sample(id=str(uid) if uid else self.sample_id(index),
                      turns=[problem_solution_prompt(self.field(rec, index, "problem"))], chat=self.chat,
                      reference=str(self.field(rec, index, "answer")),
                      meta={"index": index, "subject": rec.get("subject"), "level": rec.get("level"),
                            "solution": rec.get("solution")})
