# SPDX-License-Identifier: Apache-2.0
"""On-disk format of routing traces: safetensors shards, one JSON sidecar per finished shard, an index.

Layout of a trace directory::

    index.json                  written last: meta + every shard's sample table (``complete: true``)
    plan.json                   the collection plan (fingerprint, shard -> sample ids), written first
    train-00000.safetensors     token_ids [T] int32, positions [T] int32 (within the sample),
                                sample [T] int32 (row of the shard's sample table: its id),
                                generated [T] bool (target continuation, not prompt),
                                routing [T, L, K] int16 (router top-K experts per MoE layer)
    train-00000.json            sidecar: the shard's samples (id, offset, length, prompt_length); its
                                presence marks the shard finished
    test-00000.safetensors ...

Why not parquet: every column is a fixed-shape numeric array, which safetensors stores memory-mapped and
sliceable, with no ``pyarrow`` dependency. A sample is contiguous in one shard (a window is one slice per column).

Crash safety: files are written to a temporary name and renamed; a shard is finished only once its sidecar
exists, so a killed collection redoes at most the shard in flight and never stores a sample twice.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from specmoe.errors import UserError
from specmoe.utils.files import atomic_path, atomic_write

__all__ = ["TRACE_FORMAT", "TraceMeta", "SampleRecord", "SampleTrace", "ShardInfo", "TraceWriter",
           "TraceReader", "COLUMNS"]

TRACE_FORMAT = "specmoe-routing-traces"
_VERSION = 1
#: column name -> storage dtype
COLUMNS = {"token_ids": torch.int32, "positions": torch.int32, "sample": torch.int32, "generated": torch.bool,
           "routing": torch.int16}


@dataclass
class TraceMeta:
    """The traced target: ``num_layers`` MoE layers ``L``, ``num_experts`` routed experts per layer ``E``,
    ``top_k`` experts per token ``K``, vocabulary and hidden size; ``target``: its options / resolved path (to load
    its embedding later); ``extra``: collection options (informational)."""

    num_layers: int
    num_experts: int
    top_k: int
    vocab_size: int
    hidden_size: int
    target: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class SampleRecord:
    """Where one sample lives: ``shard`` file, token ``offset`` and ``length`` inside it."""

    id: str
    split: str
    shard: str
    offset: int
    length: int
    prompt_length: int


@dataclass
class SampleTrace:
    """One traced sample in memory: ``tokens [T]`` int64 prompt + generated ids (the first ``prompt_length``
    are prompt), ``routing [T, L, K]`` int64 router experts per MoE layer; ``id`` unique in the directory."""

    id: str
    tokens: torch.Tensor
    routing: torch.Tensor
    prompt_length: int


@dataclass
class ShardInfo:
    file: str
    split: str
    samples: list[SampleRecord]

    @property
    def num_tokens(self) -> int:
        return sum(s.length for s in self.samples)


class TraceWriter:
    """Writes shards of the trace directory ``root`` (created); ``fingerprint`` identifies the collection plan:
    reopening a directory of another plan is refused."""

    def __init__(self, root: str | Path, meta: TraceMeta, fingerprint: str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.meta = meta
        self.fingerprint = fingerprint
        plan = self.root / "plan.json"
        if plan.is_file():
            old = json.loads(plan.read_text()).get("fingerprint")
            if old != fingerprint:
                raise UserError(f"{self.root} holds traces of a different collection plan (dataset, target "
                                f"or options changed): delete the directory or choose another output "
                                f"directory")

    def write_plan(self, shards: dict[str, list[str]]) -> None:
        """Record the plan (shard file stem -> sample ids) before any shard is written."""
        atomic_write(self.root / "plan.json", json.dumps(
            {"format": TRACE_FORMAT, "version": _VERSION, "fingerprint": self.fingerprint, "shards": shards},
            indent=1))

    def finished(self) -> set[str]:
        """Stems of the shards whose sidecar exists (finished before any crash)."""
        return {p.stem for p in self.root.glob("*.json") if p.stem not in ("index", "plan")}

    def write_shard(self, stem: str, split: str, samples: list[SampleTrace]) -> ShardInfo:
        """Store ``samples`` (in order) as shard ``stem``; the sidecar is written last."""
        from safetensors.torch import save_file

        records, offset = [], 0
        for s in samples:
            records.append(SampleRecord(s.id, split, f"{stem}.safetensors", offset, int(s.tokens.numel()),
                                        int(s.prompt_length)))
            offset += int(s.tokens.numel())
        cols = {
            "token_ids": torch.cat([s.tokens for s in samples]),
            "positions": torch.cat([torch.arange(s.tokens.numel()) for s in samples]),
            "sample": torch.cat([torch.full((s.tokens.numel(),), i) for i, s in enumerate(samples)]),
            "generated": torch.cat([torch.arange(s.tokens.numel()) >= s.prompt_length for s in samples]),
            "routing": torch.cat([s.routing.reshape(-1, self.meta.num_layers, self.meta.top_k)
                                  for s in samples]),
        }
        cols = {k: v.to(COLUMNS[k]).contiguous() for k, v in cols.items()}
        with atomic_path(self.root / f"{stem}.safetensors") as tmp:
            save_file(cols, str(tmp), metadata={"format": TRACE_FORMAT, "split": split})
        info = ShardInfo(f"{stem}.safetensors", split, records)
        atomic_write(self.root / f"{stem}.json", json.dumps(
            {"file": info.file, "split": split, "samples": [asdict(r) for r in records]}))
        return info

    def write_index(self, order: list[str]) -> None:
        """Consolidate the sidecars of shards ``order`` into ``index.json`` (marks the directory complete)."""
        shards = []
        for stem in order:
            side = json.loads((self.root / f"{stem}.json").read_text())
            shards.append(side)
        index = {"format": TRACE_FORMAT, "version": _VERSION, "complete": True,
                 "fingerprint": self.fingerprint, "meta": asdict(self.meta), "shards": shards}
        atomic_write(self.root / "index.json", json.dumps(index, indent=1))


class TraceReader:
    """Reads a complete trace directory (with ``index.json``) lazily: memory-mapped shards, one sample or window
    at a time."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        index = self.root / "index.json"
        if not index.is_file():
            raise UserError(f"{self.root} is not a finished trace directory (no index.json): run the "
                            f"collect_traces stage to completion first")
        data = json.loads(index.read_text())
        if data.get("format") != TRACE_FORMAT:
            raise UserError(f"{index} is not a routing-trace index (format {data.get('format')!r})")
        self.meta = TraceMeta(**data["meta"])
        self.shards = [ShardInfo(s["file"], s["split"], [SampleRecord(**r) for r in s["samples"]])
                       for s in data["shards"]]
        self._handles: dict[str, Any] = {}

    def samples(self, split: str | None = None) -> list[SampleRecord]:
        """Sample records of ``split`` (all splits when None), in storage order."""
        return [r for s in self.shards if split is None or s.split == split for r in s.samples]

    def splits(self) -> dict[str, int]:
        """Split name -> number of samples."""
        out: dict[str, int] = {}
        for s in self.shards:
            out[s.split] = out.get(s.split, 0) + len(s.samples)
        return out

    def num_tokens(self, split: str | None = None) -> int:
        return sum(r.length for r in self.samples(split))

    def _open(self, file: str):
        from safetensors import safe_open

        h = self._handles.get(file)
        if h is None:
            h = self._handles[file] = safe_open(str(self.root / file), framework="pt")
        return h

    def read(self, rec: SampleRecord, start: int = 0, stop: int | None = None,
             columns: tuple[str, ...] = ("token_ids", "routing")) -> dict[str, torch.Tensor]:
        """Tokens ``[start, stop)`` of one sample; only the requested columns are read (int64)."""
        stop = rec.length if stop is None else min(stop, rec.length)
        h = self._open(rec.shard)
        a, b = rec.offset + start, rec.offset + stop
        return {c: h.get_slice(c)[a:b].long() if c != "generated" else h.get_slice(c)[a:b] for c in columns}

    def iter_shards(self, split: str | None = None) -> Iterator[tuple[ShardInfo, dict[str, torch.Tensor]]]:
        """Stream whole shards of ``split`` (one shard's columns in memory at a time)."""
        from safetensors.torch import load_file

        for s in self.shards:
            if split is None or s.split == split:
                yield s, load_file(str(self.root / s.file))

    def iter_samples(self, split: str | None = None
                     ) -> Iterator[tuple[SampleRecord, dict[str, torch.Tensor]]]:
        """Stream samples of ``split`` with all their columns."""
        for rec in self.samples(split):
            yield rec, self.read(rec, columns=tuple(COLUMNS))

    def __getstate__(self) -> dict[str, Any]:  # open handles do not cross process boundaries
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state
