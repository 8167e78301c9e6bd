# SPDX-License-Identifier: Apache-2.0
"""``jsonl``: your own prompts from a local JSON Lines file (``.jsonl``, ``.jsonl.gz`` or a ``.json`` array).

Recipe examples::

    datasets:
      - {name: jsonl, path: data/my_prompts.jsonl}                          # field "prompt"
      - {name: jsonl, path: qa.jsonl, template: "Q: {question}\\nA:", reference_field: answer}
      - {name: jsonl, path: chats.jsonl, turns_field: turns, chat: true}     # multi-turn, chat template

``path`` may also be relative to ``data_dir`` / ``$SPECMOE_DATA_DIR`` (given as ``file``). ``template`` is a
Python format string over the record's fields (write literal braces as ``{{`` and ``}}``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from specmoe.data.base import BenchmarkDataset
from specmoe.data.sources import DataRequest
from specmoe.errors import UserError
from specmoe.interfaces.dataset import Sample

__all__ = ["JsonlPrompts"]


class JsonlPrompts(BenchmarkDataset):
    """Generic prompt file: one record per line, the prompt taken from a field or built by a template."""

    description = "your own prompts from a JSONL file (field or format template)"
    key = "jsonl"
    default_chat = False

    @dataclass
    class Config(BenchmarkDataset.Config):
        file: Optional[str] = None
        """file name relative to ``data_dir`` / ``$SPECMOE_DATA_DIR`` (when ``path`` is not given); also the
        file inside ``hub_id`` when ``hub_file`` is unset."""
        field: str = "prompt"
        """record field holding the prompt text (ignored with ``template`` or ``turns_field``)."""
        template: Optional[str] = None
        """format string over the record's fields, e.g. ``"Question: {question}\\nAnswer:"``."""
        turns_field: Optional[str] = None
        """record field holding a list of user turns (multi-turn chat prompts)."""
        reference_field: Optional[str] = None
        """record field with the gold answer, if any."""
        id_field: Optional[str] = None
        """record field with a stable id; default: the line index."""

    def request(self, split: Optional[str] = None, path: Optional[str] = None) -> DataRequest:
        cfg = self.config
        if not (cfg.path or cfg.file or (cfg.hub_id and cfg.hub_file)):
            raise UserError("dataset jsonl: set `path` (a JSONL file), or `file` (relative to `data_dir` / "
                            "$SPECMOE_DATA_DIR), or `hub_id` + `hub_file`")
        rel = cfg.file or cfg.hub_file or ""
        return DataRequest(what=f"dataset jsonl ('{cfg.path or rel}')", relative=rel, path=cfg.path,
                           data_dir=cfg.data_dir, hub_id=cfg.hub_id, hub_file=cfg.hub_file or cfg.file,
                           revision=cfg.revision)

    def _text(self, rec: dict[str, Any], index: int) -> str:
        template = self.config.template
        if template is None:
            value = self.field(rec, index, self.config.field)
            if not isinstance(value, str):
                raise UserError(f"dataset jsonl: record {index} of {self.source}: field "
                                f"'{self.config.field}' is a {type(value).__name__}, expected text")
            return value
        try:
            return template.format_map(rec)
        except KeyError as exc:
            raise UserError(f"dataset jsonl: `template` uses field {exc} that record {index} of "
                            f"{self.source} lacks (it has: {', '.join(map(str, rec))})") from exc
        except (IndexError, ValueError) as exc:
            raise UserError(f"dataset jsonl: bad `template` {template!r}: {exc} (write literal braces as "
                            f"'{{{{' and '}}}}')") from exc

    def to_sample(self, index: int, rec: dict[str, Any]) -> Sample:
        cfg = self.config
        if cfg.turns_field:
            turns = self.field(rec, index, cfg.turns_field)
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
                raise UserError(f"dataset jsonl: record {index} of {self.source}: field '{cfg.turns_field}' "
                                f"must be a non-empty list of strings")
        else:
            turns = [self._text(rec, index)]
        ref = self.field(rec, index, cfg.reference_field) if cfg.reference_field else None
        native = self.field(rec, index, cfg.id_field) if cfg.id_field else index
        return Sample(id=self.sample_id(native), turns=list(turns), chat=self.chat,
                      reference=None if ref is None else str(ref), meta={"index": index})
