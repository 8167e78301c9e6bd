# SPDX-License-Identifier: Apache-2.0
"""Count the aten operations and host synchronisations of a piece of code.

``aten ops`` are the operator calls that reach the dispatcher below autograd (one per kernel launch on a GPU,
views included); ``host syncs`` are the calls that make the host wait for a device value: ``.item()``,
``bool()/int()/float()`` of a tensor (``aten._local_scalar_dense``), ``.tolist()``, ``.numpy()``, copies from a
device to the CPU, and operators whose output size depends on tensor values (``nonzero``, ``unique``,
``masked_select``, indexing with a boolean mask). They are counted the same way on every device (on a CPU
they are cheap but they are exactly the calls that stall a GPU stream and break CUDA-graph capture).

Counting adds overhead: measure times in a separate run.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCounts", "count_ops", "top"]

#: operators whose output shape depends on tensor values (a device-to-host read of a size)
_DATA_DEPENDENT = {"nonzero", "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim",
                   "masked_select", "repeat_interleave"}
#: tensor methods that read values on the host
_HOST_READS = {"tolist", "numpy"}


@dataclass
class OpCounts:
    """What :func:`count_ops` saw: per operator name, and per ``(phase, name)`` where ``phase`` is whatever the
    caller set :attr:`phase` to while the operator ran."""

    ops: Counter = field(default_factory=Counter)
    syncs: Counter = field(default_factory=Counter)
    by_phase_ops: Counter = field(default_factory=Counter)
    by_phase_syncs: Counter = field(default_factory=Counter)
    phase: str = ""
    reading: bool = False  # inside a counted host read (its own device-to-host copy is not counted again)

    def op(self, name: str) -> None:
        self.ops[name] += 1
        self.by_phase_ops[(self.phase, name)] += 1

    def sync(self, name: str) -> None:
        if self.reading:
            return
        self.syncs[name] += 1
        self.by_phase_syncs[(self.phase, name)] += 1

    @property
    def total_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def total_syncs(self) -> int:
        return sum(self.syncs.values())


def _has_bool_index(args: tuple) -> bool:
    idx = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (idx or ()) if i is not None)


class _Dispatch(TorchDispatchMode):
    def __init__(self, counts: OpCounts) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.counts.op(name)
        if name == "_local_scalar_dense" or name in _DATA_DEPENDENT:
            self.counts.sync(name)
        elif name in ("index", "index_put", "index_put_") and _has_bool_index(args):
            self.counts.sync(name + "(bool)")
        elif name in ("_to_copy", "copy_"):
            src = args[1] if name == "copy_" else args[0]
            dst_dev = args[0].device if name == "copy_" else kwargs.get("device")
            if isinstance(src, torch.Tensor) and src.device.type != "cpu" and dst_dev is not None \
                    and torch.device(dst_dev).type == "cpu":
                self.counts.sync("device_to_host")
        return func(*args, **kwargs)


class _Function(TorchFunctionMode):
    def __init__(self, counts: OpCounts) -> None:
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name not in _HOST_READS or self.counts.reading:
            return func(*args, **(kwargs or {}))
        self.counts.sync(name)
        self.counts.reading = True
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.counts.reading = False


@contextmanager
def count_ops() -> Iterator[OpCounts]:
    """``with count_ops() as c: ...`` then ``c.total_ops``, ``c.total_syncs``, ``c.ops``, ``c.syncs``."""
    counts = OpCounts()
    with _Function(counts), _Dispatch(counts):
        yield counts


def top(counter: Counter, n: int = 12) -> str:
    """``name x count, ...`` of the most frequent entries."""
    return ", ".join(f"{k} x{v}" for k, v in counter.most_common(n))

