# SPDX-License-Identifier: Apache-2.0
"""``gsm8k``: grade-school math word problems, with the paper's 5-shot chain-of-thought prompt.

Prompt (``format: fewshot``, the paper's "standard 5-shot CoT" setting, Appendix E): five worked exemplars
from the **train** split, then the question::

    Question: <exemplar question>
    Answer: <exemplar reasoning, calculator annotations <<...>> removed>
    The answer is <exemplar final answer>.

    ... (5 exemplars, separated by a blank line)

    Question: <question>
    Answer:

The exemplars are the first ``num_shots`` train problems (or a seeded sample with ``fewshot_seed``); with
``split: train`` they are removed from the selectable pool, so a prompt never contains its own answer.

Training text: ``GSM8K(split="train", format="qa_text")`` yields samples whose single turn is a complete
``Question: ...\\nAnswer: ...\\nThe answer is N.`` text, and :meth:`GSM8K.texts` returns those strings
directly for pretraining the tiny targets. The test split is for evaluation only: ``texts()`` refuses it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

from specmoe.data.base import BenchmarkDataset, select_indices
from specmoe.data.sources import DataRequest
from specmoe.errors import UserError
from specmoe.interfaces.dataset import Sample

__all__ = ["GSM8K", "final_answer", "worked_answer"]

_CALC = re.compile(r"<<[^>]*>>")


def final_answer(solution: str) -> str:
    """The final answer after the last ``####``, thousands separators removed (``#### 1,600`` -> ``1600``)."""
    if "####" not in solution:
        raise ValueError("no '####' in the GSM8K solution")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def worked_answer(solution: str, strip_calculator: bool = True) -> str:
    """The reasoning lines followed by ``The answer is N.`` (``####`` line replaced)."""
    steps = solution.rsplit("####", 1)[0].rstrip()
    if strip_calculator:
        steps = _CALC.sub("", steps)
    return f"{steps}\nThe answer is {final_answer(solution)}."


class GSM8K(BenchmarkDataset):
    """GSM8K test (1319) or train (7473) problems."""

    description = "GSM8K math word problems, 5-shot CoT from the train split (paper App. E)"
    key = "gsm8k"
    files = {"test": "gsm8k/test.jsonl", "train": "gsm8k/train.jsonl"}
    hub_repo = "openai/gsm8k"
    hub_files = {"test": "main/test-00000-of-00001.parquet", "train": "main/train-00000-of-00001.parquet"}
    default_chat = False

    @dataclass
    class Config(BenchmarkDataset.Config):
        format: Literal["fewshot", "zeroshot", "qa_text"] = "fewshot"
        """``fewshot``: the paper's k-shot CoT prompt; ``zeroshot``: ``Question: q\\nAnswer:``; ``qa_text``:
        the full question + worked answer as one text (training data, never for evaluation)."""
        num_shots: int = 5
        """exemplars prepended with ``format: fewshot``."""
        fewshot_seed: Optional[int] = None
        """null: the first ``num_shots`` train problems; an int: a seeded random choice of them."""
        fewshot_path: Optional[str] = None
        """file of the exemplar (train) split; default: found like the data (``data_dir``, env, hub)."""
        strip_calculator: bool = True
        """remove the ``<<48/2=24>>`` calculator annotations from worked answers."""

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        if self.config.num_shots < 0:
            raise UserError(f"dataset gsm8k: `num_shots` must be >= 0, got {self.config.num_shots}")
        self._shots: Optional[list[int]] = None
        self._prefix = ""

    # ------------------------------------------------------------------ exemplars
    def _exemplars(self) -> tuple[Path, list[int], str]:
        cfg = self.config
        try:
            path, train = self.read(self.request("train", cfg.fewshot_path or None))
        except UserError as exc:
            raise UserError(f"{exc}\n(These are the few-shot exemplars from the train split: point "
                            f"`fewshot_path` at gsm8k/train.jsonl, or use format: zeroshot.)") from exc
        if cfg.num_shots > len(train):
            raise UserError(f"dataset gsm8k: `num_shots` {cfg.num_shots} > {len(train)} train problems")
        if cfg.fewshot_seed is None:
            shots = list(range(cfg.num_shots))
        else:
            shots = random.Random(cfg.fewshot_seed).sample(range(len(train)), cfg.num_shots)
        prefix = "".join(self.qa_text(train[i], i) + "\n\n" for i in shots)
        return path, shots, prefix

    def request(self, split: Optional[str] = None, path: Optional[str] = None) -> DataRequest:
        """As the base class; the recipe's ``path`` is the evaluated split's file, never the exemplars'."""
        if split == "train" and split != self.config.split and path is None:
            path = ""
        return super().request(split, path)

    def records(self) -> list[dict[str, Any]]:
        records = super().records()
        self._shots, self._prefix = [], ""
        if self.config.format == "fewshot" and self.config.num_shots > 0:
            path, shots, self._prefix = self._exemplars()
            if self.source is not None and path.resolve() == self.source.resolve():
                self._shots = shots  # same file: exemplars are not selectable
        return records

    def candidates(self, records: list[dict[str, Any]]) -> list[int]:
        banned = set(self._shots or ())
        return [i for i in range(len(records)) if i not in banned]

    # ------------------------------------------------------------------ records
    def qa_text(self, rec: dict[str, Any], index: int) -> str:
        """``Question: ...\\nAnswer: <reasoning>\\nThe answer is N.`` for one record."""
        q = self.field(rec, index, "question")
        sol = self.field(rec, index, "answer")
        try:
            return f"Question: {q}\nAnswer: {worked_answer(sol, self.config.strip_calculator)}"
        except ValueError as exc:
            raise UserError(f"dataset gsm8k: record {index} of {self.source}: {exc}") from exc

    def to_sample(self, index: int, rec: dict[str, Any]) -> Sample:
        q, sol = self.field(rec, index, "question"), self.field(rec, index, "answer")
        fmt = self.config.format
        if fmt == "qa_text":
            text = self.qa_text(rec, index)
        else:
            text = (self._prefix if fmt == "fewshot" else "") + f"Question: {q}\nAnswer:"
        try:
            ref = final_answer(sol)
        except ValueError as exc:
            raise UserError(f"dataset gsm8k: record {index} of {self.source}: {exc}") from exc
        return Sample(id=self.sample_id(f"{self.config.split}/{index}"), turns=[text],
                      chat=self.chat and fmt != "qa_text", reference=ref,
                      meta={"index": index, "question": q, "solution": sol, "format": fmt})

    def texts(self) -> list[str]:
        """Plain ``question + worked answer`` training texts of the selected records (``limit``/``seed``).

        Raises:
            UserError: the split is ``test`` (evaluation data is never used for training).
        """
        if self.config.split == "test":
            raise UserError("dataset gsm8k: texts() is for training and refuses the test split; "
                            "use split: train")
        records = super().records()
        cfg = self.config
        keep = select_indices(range(len(records)), cfg.limit, cfg.seed, cfg.shuffle)
        return [self.qa_text(records[i], i) for i in keep]
