# SPDX-License-Identifier: Apache-2.0
"""``aime25``: the 30 AIME 2025 problems with the paper's zero-shot boxed-answer prompt.

Prompt (Appendix E)::

    {question}
    Please reason step by step, and put your final answer within \\boxed{}.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specmoe.data.base import BenchmarkDataset
from specmoe.interfaces.dataset import Sample

__all__ = ["AIME25", "BOXED_INSTRUCTION"]

#: appended after the problem on its own line
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


class AIME25(BenchmarkDataset):
    """AIME 2025 I and II (30 problems); a chat prompt by default."""

    description = "AIME 2025, zero-shot 'reason step by step ... \\boxed{}' prompt (paper App. E)"
    key = "aime25"
    files = {"test": "aime25/test.jsonl"}
    hub_repo = "math-ai/aime25"
    hub_files = {"test": "test.jsonl"}
    default_chat = True

    @dataclass
    class Config(BenchmarkDataset.Config):
        pass

    def to_sample(self, index: int, rec: dict[str, Any]) -> Sample:
        problem = self.field(rec, index, "problem", "question")
        answer = self.field(rec, index, "answer")
        return Sample(id=self.sample_id(rec.get("id", index)), turns=[f"{problem}\n{BOXED_INSTRUCTION}"],
                      chat=self.chat, reference=str(answer).strip(),
                      meta={"index": index, "url": rec.get("url")})
