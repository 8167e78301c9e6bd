# SPDX-License-Identifier: Apache-2.0
"""Data for the expert predictor: trace windows, a rank-aware resumable batch sampler, the DataModule,
and loading only the target's input-embedding matrix from its checkpoint.

Batching is defined on the **global** batch: each epoch a seeded permutation of all windows is cut into
global batches of ``batch_size * world_size``; rank ``r`` takes the ``r``-th slice of each, so one process with
batch ``N*b`` sees the batches N processes with batch ``b`` see together. The last global batch is completed with
padding windows (outside the loss and metrics), so every rank runs the same number of steps. A mid-epoch resume
skips the batches already trained (the DataModule's ``state_dict``): the same batches, in the same order.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator, Optional

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from specmoe.errors import UserError
from specmoe.traces.format import TraceReader

__all__ = ["TraceWindows", "GlobalBatchSampler", "collate_windows", "RoutingTraceDataModule",
           "load_target_embedding"]


class TraceWindows(Dataset):
    """Samples of one split cut into windows of at most ``max_len`` tokens (read lazily), addressed by
    ``(window index, is_padding)``."""

    def __init__(self, reader: TraceReader, split: str, max_len: int) -> None:
        self.reader = reader
        self.records = reader.samples(split)
        if not self.records:
            raise UserError(f"traces in {reader.root} have no '{split}' samples")
        self.windows = [(i, s, min(s + max_len, r.length)) for i, r in enumerate(self.records)
                        for s in range(0, r.length, max_len)]

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, key: int | tuple[int, bool]) -> dict[str, Any]:
        idx, pad = key if isinstance(key, tuple) else (key, False)
        i, a, b = self.windows[idx]
        cols = self.reader.read(self.records[i], a, b, columns=("token_ids", "routing"))
        return {"ids": cols["token_ids"], "routing": cols["routing"], "start": a, "pad": bool(pad), "window": idx}


def collate_windows(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Right-pad windows -> ``ids [B, T]``, ``positions [B, T]``, ``routing [B, T, L, K]``, ``valid [B, T]``
    (``valid`` is False on padding positions and on padding items), ``real [B, T]`` (the window's tokens,
    padding items included) and ``window [B]`` (its index in the dataset)."""
    t = max(it["ids"].numel() for it in items)
    b = len(items)
    lk = items[0]["routing"].shape[1:]
    ids = torch.zeros(b, t, dtype=torch.long)
    routing = torch.zeros(b, t, *lk, dtype=torch.long)
    valid = torch.zeros(b, t, dtype=torch.bool)
    real = torch.zeros(b, t, dtype=torch.bool)
    positions = torch.zeros(b, t, dtype=torch.long)
    for j, it in enumerate(items):
        n = it["ids"].numel()
        ids[j, :n] = it["ids"]
        routing[j, :n] = it["routing"]
        valid[j, :n] = not it["pad"]
        real[j, :n] = True
        positions[j] = it["start"] + torch.arange(t)
    window = torch.tensor([it.get("window", -1) for it in items], dtype=torch.long)
    return {"ids": ids, "positions": positions, "routing": routing, "valid": valid, "real": real, "window": window}


class GlobalBatchSampler(Sampler):
    """Yields this rank's slice (``batch_size`` items) of every global batch over ``n`` items (see the module
    docstring); ``shuffle``: a permutation seeded by ``seed + epoch``, else dataset order."""

    def __init__(self, n: int, batch_size: int, rank: int = 0, world: int = 1, shuffle: bool = True,
                 seed: int = 0) -> None:
        self.n, self.batch_size, self.rank, self.world = n, batch_size, rank, world
        self.shuffle, self.seed = shuffle, seed
        self.epoch = 0
        #: Lightning calls ``batch_sampler.sampler.set_epoch(epoch)`` at every epoch start
        self.sampler = self
        #: (epoch, batches): after a mid-epoch restart, iterations of that epoch start after the batches
        #: already trained; forgotten once another epoch is set
        self.skip: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.skip is not None and self.skip[0] != epoch:
            self.skip = None

    def __len__(self) -> int:
        return math.ceil(self.n / (self.batch_size * self.world))

    def __iter__(self) -> Iterator[list[tuple[int, bool]]]:
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=gen).tolist()
        else:
            order = list(range(self.n))
        g = self.batch_size * self.world
        skip = self.skip[1] if self.skip is not None and self.skip[0] == self.epoch else 0
        for k in range(skip, len(self)):
            chunk = [(i, False) for i in order[k * g:(k + 1) * g]]
            fill = 0
            while len(chunk) < g:  # complete the last global batch with padding items
                chunk.append((order[fill % self.n], True))
                fill += 1
            yield chunk[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]


class _ResumableLoader(DataLoader):
    """A DataLoader that tells Lightning it is resumable (the position travels in the DataModule's state)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _dist() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class RoutingTraceDataModule(L.LightningDataModule):
    """Train on the traces' ``train`` split, validate on ``test`` (the paper's held-out 20%), in windows of
    ``max_len`` tokens; ``batch_size`` / ``val_batch_size`` are per device. Use with
    ``Trainer(use_distributed_sampler=False)``: the sampler already splits batches across ranks."""

    def __init__(self, traces: str | Path, max_len: int = 512, batch_size: int = 16,
                 val_batch_size: Optional[int] = None, num_workers: int = 0, seed: int = 0,
                 train_split: str = "train", val_split: str = "test") -> None:
        super().__init__()
        self.reader = TraceReader(traces)
        self.max_len, self.batch_size = max_len, batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.num_workers, self.seed = num_workers, seed
        self.train_split, self.val_split = train_split, val_split
        self._train_sampler: GlobalBatchSampler | None = None
        self._resume_skip: tuple[int, int] | None = None

    @property
    def meta(self):
        return self.reader.meta

    def setup(self, stage: str) -> None:
        self.train_set = TraceWindows(self.reader, self.train_split, self.max_len)
        self.val_set = TraceWindows(self.reader, self.val_split, self.max_len)

    def _loader(self, ds: TraceWindows, sampler: GlobalBatchSampler) -> DataLoader:
        return _ResumableLoader(ds, batch_sampler=sampler, collate_fn=collate_windows,
                                num_workers=self.num_workers, persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        rank, world = _dist()
        self._train_sampler = GlobalBatchSampler(len(self.train_set), self.batch_size, rank, world, True,
                                                 self.seed)
        self._train_sampler.skip = self._resume_skip
        self._resume_skip = None
        return self._loader(self.train_set, self._train_sampler)

    def val_dataloader(self) -> DataLoader:
        rank, world = _dist()
        sampler = GlobalBatchSampler(len(self.val_set), self.val_batch_size, rank, world, False, self.seed)
        return self._loader(self.val_set, sampler)

    def state_dict(self) -> dict[str, Any]:
        trainer = self.trainer
        if trainer is None:
            return {}
        progress = trainer.fit_loop.epoch_loop.batch_progress.current
        return {"epoch": trainer.current_epoch, "batches_done": int(progress.processed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        skip = (int(state.get("epoch", 0)), int(state.get("batches_done", 0)))
        if self._train_sampler is not None:
            self._train_sampler.skip = skip
        else:
            self._resume_skip = skip


def load_target_embedding(path: str, revision: Optional[str] = None) -> torch.Tensor:
    """The ``[V, H]`` input-embedding matrix of the causal LM at ``path`` without loading the model.

    Reads only the safetensors file holding it (a local directory or a hub id: only that file is downloaded).
    """
    import transformers
    from safetensors import safe_open

    cfg = transformers.AutoConfig.from_pretrained(path, revision=revision)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    weight = model.get_input_embeddings().weight
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if p is weight]
    local = Path(path)

    def fetch(fname: str) -> str:
        if local.is_dir():
            return str(local / fname)
        from huggingface_hub import hf_hub_download

        return hf_hub_download(path, fname, revision=revision)

    try:
        index = json.loads(Path(fetch("model.safetensors.index.json")).read_text())["weight_map"]
    except Exception:  # noqa: BLE001 - single-file checkpoints have no index
        index = None
    for name in names:
        fname = index.get(name) if index is not None else "model.safetensors"
        if fname is None:
            continue
        with safe_open(fetch(fname), framework="pt") as f:
            if name in f.keys():
                return f.get_tensor(name)
    raise UserError(f"cannot find the input embedding ({', '.join(names)}) in the safetensors of '{path}'")
