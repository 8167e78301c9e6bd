# SPDX-License-Identifier: Apache-2.0
"""Draft-training data: the target's own responses to prompts (``responses.jsonl``), generated and read.

One JSON object per line: ``{"id": "gsm8k/train/12", "prompt_ids": [...], "response_ids": [...]}``.
:func:`write_responses` appends lines, skipping ids already present (resumable); :class:`ResponseDataset` turns
them into ``prompt + response`` sequences with a loss mask on the response tokens.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from specmoe.errors import UserError

if TYPE_CHECKING:
    from specmoe.decoding.stopping import StopRule
    from specmoe.interfaces.target import Target

__all__ = [
    "RESPONSES_FILE",
    "PromptItem",
    "ResponseDataset",
    "collate_responses",
    "read_responses",
    "response_loader",
    "write_responses",
]

logger = logging.getLogger(__name__)

RESPONSES_FILE = "responses.jsonl"


@dataclass
class PromptItem:
    """One prompt to answer: a stable id and its token ids."""

    id: str
    prompt_ids: list[int]


def read_responses(path: str | Path) -> list[dict[str, Any]]:
    """All complete lines of a ``responses.jsonl`` (a torn last line from a killed run is ignored)."""
    p = Path(path)
    if p.is_dir():
        p = p / RESPONSES_FILE
    if not p.is_file():
        raise UserError(f"no {RESPONSES_FILE} at {p}: point 'data' at a generate_responses output directory")
    out = []
    with p.open() as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                logger.warning("%s:%d: skipping a torn line", p, n)
                continue
            if not {"id", "prompt_ids", "response_ids"} <= set(rec):
                raise UserError(f"{p}:{n}: a line needs 'id', 'prompt_ids' and 'response_ids'")
            out.append(rec)
    return out


def _truncate_torn_tail(path: Path) -> None:
    """Drop a partial last line (no trailing newline) left by a killed writer."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def write_responses(target: Target, items: Sequence[PromptItem], path: str | Path, *, max_new_tokens: int,
                    temperature: float = 0.0, stop: Optional[StopRule] = None, batch_size: int = 8, seed: int = 0,
                    progress: bool = False) -> dict[str, Any]:
    """Generate the target's responses to ``items`` and append them to ``path`` (resumable).

    ``stop`` defaults to ``max_new_tokens`` and the target's EOS; each batch samples with ``seed + index of its
    first item`` (a resumed run samples alike). Returns this call's ``{"written", "skipped", "total",
    "response_tokens", "seconds"}``.
    """
    from specmoe.decoding.ar import ar_generate
    from specmoe.decoding.stopping import StopRule

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    _truncate_torn_tail(p)
    done = {r["id"] for r in read_responses(p)} if p.is_file() else set()
    todo = [(i, it) for i, it in enumerate(items) if it.id not in done]
    stop = stop or StopRule(max_new_tokens, stop_ids=target.eos_token_ids)
    t0 = time.perf_counter()
    n_tok = 0
    with p.open("a") as f:
        for s in range(0, len(todo), batch_size):
            chunk = todo[s:s + batch_size]
            gen = ar_generate(target, [it.prompt_ids for _, it in chunk], temperature=temperature, stop=stop,
                              seed=seed + chunk[0][0], capture_routing=False)
            for (_, it), resp in zip(chunk, gen.tokens):
                line = {"id": it.id, "prompt_ids": list(it.prompt_ids), "response_ids": resp}
                f.write(json.dumps(line) + "\n")
                n_tok += len(resp)
            f.flush()
            if progress:
                logger.info("responses: %d / %d", s + len(chunk), len(todo))
    return {"written": len(todo), "skipped": len(items) - len(todo), "total": len(done) + len(todo),
            "response_tokens": n_tok, "seconds": time.perf_counter() - t0}


class ResponseDataset(torch.utils.data.Dataset):
    """Training sequences from :func:`read_responses` lines, cut to ``max_length`` tokens at the end and to
    ``max_prompt_tokens`` prompt tokens at the start (None keeps all)."""

    def __init__(self, records: Iterable[dict[str, Any]], max_length: int = 2048,
                 max_prompt_tokens: Optional[int] = None) -> None:
        self.items: list[tuple[list[int], int]] = []
        for r in records:
            prompt = list(r["prompt_ids"])
            if max_prompt_tokens is not None:
                prompt = prompt[-max_prompt_tokens:] if max_prompt_tokens > 0 else []
            resp = list(r["response_ids"])
            if not resp:
                continue
            seq = (prompt + resp)[:max_length]
            if len(seq) - len(prompt) < 1 or len(seq) < 3:
                continue
            self.items.append((seq, len(prompt)))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        seq, n_prompt = self.items[i]
        ids = torch.tensor(seq, dtype=torch.long)
        mask = torch.zeros(len(seq), dtype=torch.bool)
        mask[n_prompt:] = True
        return {"input_ids": ids, "loss_mask": mask}

    def response_tokens(self) -> Iterable[list[int]]:
        """The trained-on (response) tokens of every sequence, for the draft vocabulary."""
        for seq, n_prompt in self.items:
            yield seq[n_prompt:]


def collate_responses(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence: ``input_ids``, ``valid``, ``loss_mask`` all ``[B, L]``."""
    n = max(int(b["input_ids"].numel()) for b in batch)
    ids = torch.zeros(len(batch), n, dtype=torch.long)
    valid = torch.zeros(len(batch), n, dtype=torch.bool)
    mask = torch.zeros(len(batch), n, dtype=torch.bool)
    for i, b in enumerate(batch):
        m = int(b["input_ids"].numel())
        ids[i, :m] = b["input_ids"]
        valid[i, :m] = True
        mask[i, :m] = b["loss_mask"]
    return {"input_ids": ids, "valid": valid, "loss_mask": mask}


def response_loader(records: Iterable[dict[str, Any]], *, max_length: int, max_prompt_tokens: Optional[int],
                    batch_size: int, shuffle: bool, seed: int = 0, num_workers: int = 0):
    """``(dataset, loader)``: a :class:`ResponseDataset` and its dataloader of :func:`collate_responses`
    batches (shuffled with a generator seeded by ``seed`` when ``shuffle``)."""
    ds = ResponseDataset(records, max_length, max_prompt_tokens)
    gen = torch.Generator().manual_seed(seed) if shuffle else None
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=shuffle, generator=gen,
                                         collate_fn=collate_responses, num_workers=num_workers)
    return ds, loader
