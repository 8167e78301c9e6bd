# SPDX-License-Identifier: Apache-2.0
"""The common base of the benchmark ``dataset`` plugins: sources, subset selection, field access."""

from __future__ import annotations

import random
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional

from specmoe.data.sources import DataRequest, locate, read_records
from specmoe.errors import UserError
from specmoe.interfaces.dataset import Dataset, Sample

__all__ = ["BenchmarkDataset", "select_indices"]


def select_indices(pool: Sequence[int], limit: Optional[int], seed: Optional[int],
                   shuffle: bool) -> list[int]:
    """The indices of ``pool`` (file order) to keep, deterministically: at most ``limit`` (None: all); with
    ``limit``, ``seed`` picks a uniformly random subset kept in file order (None: the first ``limit``);
    ``shuffle``: in a random order seeded by ``seed`` (0 when None)."""
    keep = list(pool)
    if limit is not None and limit < len(keep):
        keep = keep[:limit] if seed is None else sorted(random.Random(seed).sample(keep, limit))
    if shuffle:
        random.Random(0 if seed is None else seed).shuffle(keep)
    return keep


class BenchmarkDataset(Dataset):
    """A benchmark read from a local file or a hub dataset repository. Subclasses set :attr:`key`, :attr:`files`
    and optionally :attr:`hub_repo` / :attr:`hub_files`, and implement :meth:`to_sample`."""

    #: registry name; prefixes sample ids and error messages
    key: ClassVar[str] = ""
    #: split -> file under a data directory (the layout of ``shared/data/``)
    files: ClassVar[dict[str, str]] = {}
    #: default hub dataset repository (None: no hub fallback)
    hub_repo: ClassVar[Optional[str]] = None
    #: split -> file inside :attr:`hub_repo`
    hub_files: ClassVar[dict[str, str]] = {}
    #: parquet columns never read (e.g. images)
    drop_columns: ClassVar[tuple[str, ...]] = ()
    #: whether samples use the chat template when the recipe leaves ``chat`` unset
    default_chat: ClassVar[bool] = False

    @dataclass
    class Config:
        path: Optional[str] = None
        """the benchmark file itself (``.jsonl``, ``.jsonl.gz``, ``.json`` or ``.parquet``); wins over the
        other sources and must exist when set."""
        data_dir: Optional[str] = None
        """a directory laid out like the project's ``shared/data/``; default: ``$SPECMOE_DATA_DIR``."""
        hub_id: Optional[str] = None
        """hub dataset repository used when no local file is found; default: the plugin's own."""
        hub_file: Optional[str] = None
        """file inside ``hub_id``; default: the plugin's file for ``split``."""
        revision: Optional[str] = None
        """hub revision (branch, tag or commit sha); default: the repository's default branch."""
        split: str = "test"
        """which split to read (most benchmarks only have ``test``)."""
        limit: Optional[int] = None
        """keep at most this many samples; null keeps all."""
        seed: Optional[int] = 0
        """with ``limit``: seed of the random subset (kept in file order); null takes the first ``limit``.
        Also seeds ``shuffle``."""
        shuffle: bool = False
        """return the samples in a seeded random order instead of file order."""
        chat: Optional[bool] = None
        """render through the target's chat template; null: the benchmark's convention."""

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        if self.config.limit is not None and self.config.limit < 1:
            raise UserError(f"dataset {self.key}: `limit` must be >= 1 or null, got {self.config.limit}")
        self.source: Optional[Path] = None

    @property
    def chat(self) -> bool:
        """Whether this dataset's samples are rendered with the chat template."""
        return self.default_chat if self.config.chat is None else bool(self.config.chat)

    def request(self, split: Optional[str] = None, path: Optional[str] = None) -> DataRequest:
        """The :class:`DataRequest` of ``split`` (default: the configured one)."""
        cfg = self.config
        split = cfg.split if split is None else split
        explicit = cfg.path if path is None else path
        if split not in self.files and not explicit:
            raise UserError(f"dataset {self.key}: unknown split '{split}'; "
                            f"available: {', '.join(self.files)}")
        rel = self.files.get(split, f"{self.key}/{split}")
        own_hub = cfg.hub_id is None
        hub_file = cfg.hub_file if (cfg.hub_file and split == cfg.split) else self.hub_files.get(split)
        return DataRequest(what=f"dataset {self.key} (split '{split}')", relative=rel, path=explicit,
                           data_dir=cfg.data_dir, hub_id=self.hub_repo if own_hub else cfg.hub_id,
                           hub_file=hub_file, revision=cfg.revision)

    def read(self, req: DataRequest) -> tuple[Path, list[dict[str, Any]]]:
        """Locate and read one file; returns ``(path, records)``."""
        path = locate(req)
        records = read_records(path, self.drop_columns)
        if not records:
            raise UserError(f"{req.what}: {path} holds no records")
        return path, records

    def records(self) -> list[dict[str, Any]]:
        """All records of the configured split, in file order (remembers the file in :attr:`source`)."""
        self.source, records = self.read(self.request())
        return records

    def candidates(self, records: list[dict[str, Any]]) -> list[int]:
        """Record indices eligible for selection (default: all)."""
        return list(range(len(records)))

    def load(self) -> list[Sample]:
        """The selected samples (``limit`` / ``seed`` / ``shuffle`` applied)."""
        records = self.records()
        cfg = self.config
        keep = select_indices(self.candidates(records), cfg.limit, cfg.seed, cfg.shuffle)
        return [self.to_sample(i, records[i]) for i in keep]

    @abstractmethod
    def to_sample(self, index: int, rec: dict[str, Any]) -> Sample:
        """Turn record ``index`` of the file into a :class:`Sample` (each benchmark's own format)."""

    def field(self, rec: dict[str, Any], index: int, *names: str) -> Any:
        """The first of ``names`` present in ``rec`` (local and hub copies name some fields differently);
        ``UserError`` when none is."""
        for name in names:
            if name in rec and rec[name] is not None:
                return rec[name]
        raise UserError(f"dataset {self.key}: record {index} of {self.source} has no field "
                        f"{' / '.join(repr(n) for n in names)} (it has: {', '.join(map(str, rec))})")

    def sample_id(self, native: Any) -> str:
        """``<key>/<native id>``, e.g. ``aime25/90``."""
        return f"{self.key}/{native}"
