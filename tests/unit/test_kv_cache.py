# SPDX-License-Identifier: Apache-2.0
"""The in-place KV cache: passes write into preallocated buffers (no per-step reallocation), pruning after
acceptance moves only the kept slots of the last pass (what it touches does not depend on the context length),
and the pruned cache equals the reference gather of the kept slots, for one row and for a batch."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specmoe.interfaces.kv import KVState

H, D = 2, 4


def _pass(kv: KVState, n: int, valid: torch.Tensor | None = None, layers: int = 2, seed: int = 0):
    """Append ``n`` random slots to every layer (what a forward pass does); returns the keys / values added."""
    b = kv.batch_size
    g = torch.Generator().manual_seed(seed)
    added = []
    for layer in range(layers):
        k = torch.randn(b, H, n, D, generator=g)
        v = torch.randn(b, H, n, D + 1, generator=g)  # values may have another head size (MLA)
        kv.cache.update(k, v, layer)
        added.append((k, v))
    pos = kv.next_position()[:, None] + torch.arange(n)[None]
    kv.append(pos, torch.ones(b, n, dtype=torch.bool) if valid is None else valid)
    return added


def test_passes_write_in_place_and_grow_by_doubling():
    kv = KVState(1, capacity=64)
    _pass(kv, 10)
    ptr = kv.cache.layers[0]._k.data_ptr()
    for i in range(20):
        _pass(kv, 2, seed=i + 1)
    assert kv.num_slots == 50 and kv.cache.layers[0].keys.shape[2] == 50
    assert kv.cache.layers[0]._k.data_ptr() == ptr  # no reallocation within the capacity
    _pass(kv, 30, seed=99)  # past 64 slots: the buffers double once
    assert kv.num_slots == 80 and kv.cache.layers[0]._k.shape[2] == 128 and kv.capacity >= 80


def _reference(keys: torch.Tensor, s_old: int, kept: list[int]) -> torch.Tensor:
    idx = torch.tensor(list(range(s_old)) + [s_old + j for j in kept])
    return keys.index_select(2, idx)


@pytest.mark.parametrize("kept", [[0, 1], [0, 2, 3], [0, 3], [0]])
def test_keep_last_one_row_equals_the_reference_gather(kept):
    kv = KVState(1)
    _pass(kv, 9)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in kv.cache.layers]
    pos_before = kv.pos.clone()
    _pass(kv, 5, seed=1)
    full = [(layer.keys.clone(), layer.values.clone()) for layer in kv.cache.layers]
    flags = torch.zeros(1, 5, dtype=torch.bool)
    flags[0, kept] = True
    kv.keep_last(5, flags)
    assert kv.num_slots == 9 + len(kept)
    for layer, (k0, v0), (k1, v1) in zip(kv.cache.layers, before, full):
        assert torch.equal(layer.keys, _reference(k1, 9, kept)) and torch.equal(layer.values, _reference(v1, 9, kept))
        assert torch.equal(layer.keys[:, :, :9], k0) and torch.equal(layer.values[:, :, :9], v0)
    assert torch.equal(kv.pos[:, :9], pos_before) and bool(kv.valid.all())
    assert kv.pos[0, 9:].tolist() == [9 + j for j in kept]


def test_keep_last_batch_compacts_each_row_and_pads():
    kv = KVState(3)
    _pass(kv, 6)
    _pass(kv, 4, seed=3)
    full = [layer.keys.clone() for layer in kv.cache.layers]
    keep = [[0, 2], [0, 1, 2, 3], [0]]
    kv.keep_last(4, keep)
    assert kv.num_slots == 6 + 4
    for layer, k1 in zip(kv.cache.layers, full):
        for b, kept in enumerate(keep):
            got = layer.keys[b:b + 1, :, :6 + len(kept)]
            assert torch.equal(got, _reference(k1[b:b + 1], 6, kept))
    assert kv.valid[:, 6:].tolist() == [[True, True, False, False], [True] * 4, [True, False, False, False]]
    assert kv.next_position().tolist() == [8, 10, 7]
    assert kv.pos[0, 6:8].tolist() == [6, 8]


class _Sizes(TorchDispatchMode):
    """The largest number of elements any operation produced."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and func.overloadpacket.__name__ not in ("narrow", "slice", "view",
                                                                                     "as_strided", "alias"):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("rows", [1, 2])
def test_pruning_touches_only_the_last_pass(rows):
    """Same operations and the same largest tensor at 16 and 1024 cached slots: the cost of pruning does not
    grow with the context (the old cache gathered every slot of every layer)."""
    from specmoe.bench.opcount import count_ops

    seen = []
    for context in (16, 1024):
        kv = KVState(rows, capacity=context + 8)
        _pass(kv, context)
        _pass(kv, 6, seed=5)
        sizes = _Sizes()
        with count_ops() as c, sizes:
            kv.keep_last(6, [[0, 2, 3]] * (rows - 1) + [[0, 1, 4]])
        assert c.total_syncs == 0
        seen.append((dict(c.ops), sizes.largest))
    assert seen[0] == seen[1]
    assert seen[0][1] <= rows * H * 6 * (D + 1)


def test_drop_last_and_prefix_keep_move_nothing():
    from specmoe.bench.opcount import count_ops

    kv = KVState(1)
    _pass(kv, 12)
    _pass(kv, 4, seed=1)
    with count_ops() as c:
        kv.keep_last(4, [[0, 1]])
        kv.drop_last(1)
    assert kv.num_slots == 13 and set(c.ops) <= {"slice", "narrow", "alias", "as_strided", "view"}  # views only
