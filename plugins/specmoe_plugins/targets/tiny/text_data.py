# SPDX-License-Identifier: Apache-2.0
"""Packed causal-LM blocks from local JSONL text (default: GSM8K train, question + worked answer).

Each JSONL record becomes one document through a formatter (:data:`FORMATTERS`): ``template`` fills a
``str.format`` template with the record's fields; ``gsm8k_cot`` writes ``Question: q\\nAnswer: <steps>\\nThe
answer is N.`` with the ``<<...>>`` calculator annotations removed, the layout of the ``gsm8k`` benchmark's
few-shot prompts. Documents are shuffled with a seed and split into train/val *by document*. Consecutive
documents are then grouped into contexts of 1..``docs_per_context`` documents (seeded sizes) joined by
``separator``, so a k-shot prompt (exemplars separated by a blank line) is in-distribution; each context is
tokenized as ``bos + text + eos``, all are concatenated and cut into fixed-length blocks (remainder dropped).
Test splits are refused as training text.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import lightning as L

from specmoe.errors import UserError
from specmoe_plugins.targets.tiny.tokenizer import DOCUMENT_TEMPLATE

__all__ = ["TextSource", "GSM8K_TRAIN", "FORMATTERS", "read_documents", "group_documents", "pack_documents",
           "TextDataModule", "SeededSampler"]

_CALCULATOR = re.compile(r"<<[^>]*>>")


def _format_template(record: dict[str, Any], template: str) -> str:
    return template.format(**record)


def _format_gsm8k_cot(record: dict[str, Any], template: str) -> str:
    steps, sep, final = record["answer"].rpartition("####")
    if not sep:
        raise ValueError("the answer has no '#### N' line")
    answer = f"{_CALCULATOR.sub('', steps).rstrip()}\nThe answer is {final.strip().replace(',', '')}."
    return template.format(**{**record, "answer": answer})


#: record formatter name -> fn(record, template) -> document text
FORMATTERS = {"template": _format_template, "gsm8k_cot": _format_gsm8k_cot}


@dataclass
class TextSource:
    """One JSONL file of the corpus."""

    path: str = "gsm8k/train.jsonl"
    """file relative to the data directory (or absolute)."""
    template: str = DOCUMENT_TEMPLATE
    """``str.format`` template over the record's fields, e.g. ``"{question}\\n{answer}"``."""
    format: str = "gsm8k_cot"
    """record formatter: ``template`` (fields as they are) or ``gsm8k_cot`` (``answer`` rewritten as
    calculator-free steps + ``The answer is N.``, then ``template``)."""
    limit: Optional[int] = None
    """read at most this many records (from the start of the file)."""


GSM8K_TRAIN = TextSource()


def _is_test_split(path: Path) -> bool:
    return path.stem.lower().startswith("test") or path.parent.name.lower() == "test"


def read_documents(data_dir: str | Path | None, sources: Sequence[TextSource | dict[str, Any]], *,
                   allow_test: bool = False) -> list[str]:
    """Render every record of ``sources`` into a document string (file order).

    Args:
        data_dir: directory relative paths are resolved against.
        sources: :class:`TextSource` objects or dicts with the same keys.
        allow_test: read files named ``test*`` (evaluation only; never for training).

    Raises:
        UserError: a missing file, a test split without ``allow_test``, a template naming a missing field.
    """
    docs: list[str] = []
    for raw in sources:
        src = raw if isinstance(raw, TextSource) else TextSource(**raw)
        path = Path(src.path).expanduser()
        if not path.is_absolute():
            if data_dir is None:
                raise UserError(f"text source '{src.path}' is relative but no data directory is set "
                                f"(pass --data-dir or set SPECMOE_DATA_DIR)")
            path = Path(data_dir) / path
        if not path.is_file():
            raise UserError(f"text source '{path}' does not exist: fix 'sources[].path' or the data "
                            f"directory")
        if src.format not in FORMATTERS:
            raise UserError(f"text source format '{src.format}' is not one of {', '.join(FORMATTERS)}")
        fmt = FORMATTERS[src.format]
        if _is_test_split(path) and not allow_test:
            raise UserError(f"text source '{path}' is a test split and may not be used for training: "
                            f"use the train split")
        with path.open(encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                if src.limit is not None and i >= src.limit:
                    break
                if not line.strip():
                    continue
                record = json.loads(line)
                try:
                    docs.append(fmt(record, src.template))
                except KeyError as exc:
                    raise UserError(f"{path} line {i + 1} has no field {exc} (format '{src.format}', "
                                    f"template {src.template!r}): fix 'sources[].template' or "
                                    f"'sources[].format'") from exc
                except ValueError as exc:
                    raise UserError(f"{path} line {i + 1} cannot be formatted as '{src.format}': "
                                    f"{exc}") from exc
    return docs


def group_documents(docs: Sequence[str], docs_per_context: int, seed: int,
                    separator: str = "\n\n") -> list[str]:
    """Join consecutive documents into contexts of 1..``docs_per_context`` documents (seeded sizes)."""
    if docs_per_context <= 1:
        return list(docs)
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(docs):
        k = rng.randint(1, docs_per_context)
        out.append(separator.join(docs[i:i + k]))
        i += k
    return out


def pack_documents(docs: Sequence[str], tokenizer: Any, block_size: int):
    """Tokenize ``docs`` as ``bos + text + eos``, concatenate and cut into blocks.

    Returns:
        ``(blocks [N, block_size] int64, num_tokens)``; ``num_tokens`` counts the tokens before cutting.
    """
    import torch

    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    ids = tokenizer(list(docs), add_special_tokens=False)["input_ids"] if docs else []
    flat: list[int] = []
    for seq in ids:
        if bos is not None:
            flat.append(bos)
        flat.extend(seq)
        flat.append(eos)
    n_blocks = len(flat) // block_size
    blocks = torch.tensor(flat[: n_blocks * block_size], dtype=torch.long).view(n_blocks, block_size)
    return blocks, len(flat)


class TextDataModule(L.LightningDataModule):
    """Train/val packed blocks; batches are ``{"input_ids": [B, block_size]}``.

    Args:
        tokenizer: a HF tokenizer with ``bos_token_id``/``eos_token_id``.
        data_dir: base directory of relative source paths.
        sources: corpus files (default: GSM8K train with question + answer).
        block_size: tokens per block.
        batch_size: blocks per batch.
        val_fraction: fraction of documents held out (at least one document when > 0).
        seed: document shuffle, context sizes and batch order.
        docs_per_context: documents per context at most (1: every document is its own ``bos ... eos``).
        separator: between the documents of one context.
    """

    def __init__(self, tokenizer: Any, data_dir: str | Path | None,
                 sources: Sequence[TextSource | dict[str, Any]] = (GSM8K_TRAIN,), *, block_size: int = 256,
                 batch_size: int = 16, val_fraction: float = 0.02, seed: int = 0, docs_per_context: int = 1,
                 separator: str = "\n\n") -> None:
        super().__init__()
        if not 0.0 <= val_fraction < 1.0:
            raise UserError(f"val_fraction {val_fraction} must be in [0, 1)")
        self.tokenizer = tokenizer
        self.data_dir = data_dir
        self.sources = list(sources)
        self.block_size = block_size
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.docs_per_context = docs_per_context
        self.separator = separator
        self.train_blocks = self.val_blocks = None
        self.train_tokens = self.val_tokens = 0
        self.val_docs: list[str] = []

    def setup(self, stage: str | None = None) -> None:
        if self.train_blocks is not None:
            return
        docs = read_documents(self.data_dir, self.sources)
        random.Random(self.seed).shuffle(docs)
        n_val = int(round(len(docs) * self.val_fraction))
        if self.val_fraction > 0:
            n_val = max(1, n_val)
        self.val_docs, train_docs = docs[:n_val], docs[n_val:]
        train_ctx = group_documents(train_docs, self.docs_per_context, self.seed, self.separator)
        val_ctx = group_documents(self.val_docs, self.docs_per_context, self.seed + 1, self.separator)
        self.train_blocks, self.train_tokens = pack_documents(train_ctx, self.tokenizer, self.block_size)
        self.val_blocks, self.val_tokens = pack_documents(val_ctx, self.tokenizer, self.block_size)
        if len(self.train_blocks) == 0:
            raise UserError(f"the corpus ({len(train_docs)} training documents, {self.train_tokens} tokens) "
                            f"is smaller than one block of {self.block_size} tokens: lower block_size")

    def train_dataloader(self):
        from torch.utils.data import DataLoader

        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.world_size > 1:
            # Lightning shards with a DistributedSampler; a mid-epoch resume restarts that epoch's order
            return DataLoader(_Blocks(self.train_blocks), batch_size=self.batch_size, shuffle=True,
                              num_workers=0)
        sampler = SeededSampler(len(self.train_blocks), self.seed)
        if trainer is not None:  # resumed mid-epoch: skip the batches this epoch already trained on
            loop = trainer.fit_loop
            done = int(loop.epoch_loop.batch_progress.current.processed)
            if done:
                sampler.resume_at = (int(loop.epoch_progress.current.processed), done * self.batch_size)
        return DataLoader(_Blocks(self.train_blocks), batch_size=self.batch_size, sampler=sampler,
                          num_workers=0)

    def val_dataloader(self):
        from torch.utils.data import DataLoader

        return DataLoader(_Blocks(self.val_blocks), batch_size=self.batch_size, shuffle=False, num_workers=0)


class SeededSampler:
    """A permutation of ``range(n)`` that depends only on ``(seed, epoch)``.

    Lightning calls ``set_epoch`` at each epoch start. ``resume_at = (epoch, samples)`` drops the first
    ``samples`` indices of that epoch once, so a resumed run continues where the interrupted one stopped
    instead of replaying the epoch from its start.
    """

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.seed = seed
        self.epoch = 0
        self.resume_at: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        import torch

        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.n, generator=gen).tolist()
        start = 0
        if self.resume_at is not None and self.resume_at[0] == self.epoch:
            start, self.resume_at = self.resume_at[1], None
        return iter(order[start:])


class _Blocks:
    """Map-style dataset over a ``[N, block_size]`` tensor."""

    def __init__(self, blocks: Any) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return int(self.blocks.shape[0])

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.blocks[i]}
