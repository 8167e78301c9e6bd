# SPDX-License-Identifier: Apache-2.0
"""``amc``: AI-MO's AMC validation set (83 problems of AMC 12 2022-2023), with the paper's prompt.

The paper calls it "AMC22-24"; the AI-MO set it names holds AMC 12 2022 and 2023 only. Prompt (Appendix E,
shared with ``math500``): ``"Problem:\\n{problem}\\n\\nSolution:"``. The local copy is a JSON array.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specmoe.data.base import BenchmarkDataset
from specmoe.data.templates import problem_solution_prompt
from specmoe.interfaces.dataset import Sample

__all__ = ["AMC"]


def _number(value: Any) -> str:
    """``142.0`` -> ``"142"``; other values as text."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


class AMC(BenchmarkDataset):
    """AMC 12 2022-2023 (AI-MO ``aimo-validation-amc``); a raw completion prompt by default."""

    description = "AMC 12 2022-23 (AI-MO), zero-shot 'Problem: ... Solution:' prompt (paper App. E)"
    key = "amc"
    files = {"test": "amc/amc.json"}
    hub_repo = "AI-MO/aimo-validation-amc"
    hub_files = {"test": "data/train-00000-of-00001.parquet"}
    default_chat = False

    @dataclass
    class Config(BenchmarkDataset.Config):
        pass

    def to_sample(self, index: int, rec: dict[str, Any]) -> Sample:
        return Sample(id=self.sample_id(rec.get("id", index)),
                      turns=[problem_solution_prompt(self.field(rec, index, "problem"))], chat=self.chat,
                      reference=_number(self.field(rec, index, "answer")),
                      meta={"index": index, "url": rec.get("url"), "difficulty": rec.get("difficulty")})
