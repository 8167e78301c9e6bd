# SPDX-License-Identifier: Apache-2.0
"""Shared utilities: one stable hash, one atomic write, file locks that say who holds them, ranks from
Lightning's cluster environments, and waits for rank 0 that end on its failure or a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from specmoe.utils.dist import RankFailed, WaitTimeout, dist_info, wait_for
from specmoe.utils.files import FileLock, LockTimeout, atomic_write, atomic_write_json
from specmoe.utils.hashing import stable_hash

LAUNCH = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_PROCID", "LSB_JOBID",
          "KUBERNETES_PORT", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "GROUP_RANK", "NODE_RANK", "SLURM_JOB_NAME",
          "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS_PER_NODE")


def test_stable_hash_is_stable_across_processes_and_key_order():
    obj = {"b": [1, 2.5, None], "a": {"x": "y"}}
    h = stable_hash(obj)
    assert h == stable_hash({"a": {"x": "y"}, "b": [1, 2.5, None]}) and len(h) == 16
    assert h != stable_hash({"a": {"x": "y"}, "b": [2.5, 1, None]})
    code = "from specmoe.utils.hashing import stable_hash; print(stable_hash({'b': [1, 2.5, None], 'a': {'x': 'y'}}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == h


def test_atomic_write_leaves_no_partial_file(tmp_path):
    atomic_write(tmp_path / "d" / "a.txt", "hello")
    atomic_write(tmp_path / "d" / "b.bin", b"\x00\x01")
    atomic_write_json(tmp_path / "d" / "c.json", {"k": 1})
    assert (tmp_path / "d" / "a.txt").read_text() == "hello"
    assert (tmp_path / "d" / "b.bin").read_bytes() == b"\x00\x01"
    assert json.loads((tmp_path / "d" / "c.json").read_text()) == {"k": 1}
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["a.txt", "b.bin", "c.json"]


def test_file_lock_says_who_holds_it_and_times_out(tmp_path):
    messages: list[str] = []
    holder = FileLock(tmp_path / "x.lock", "stage 'x'").acquire()
    try:
        other = FileLock(tmp_path / "x.lock", "stage 'x'", on_wait=messages.append)
        assert other.is_held_elsewhere()
        with pytest.raises(LockTimeout, match=rf"stage 'x' is in use by pid {os.getpid()} on"):
            other.acquire(timeout=0.3, poll=0.05)
        assert len(messages) == 1 and "waiting for it" in messages[0]
        released = threading.Timer(0.3, holder.release)
        released.start()
        other.acquire(timeout=10, poll=0.05)  # waits for the holder, then gets it
        other.release()
    finally:
        holder.release()


def test_a_waiter_that_arrives_before_the_holder_wrote_its_record_still_names_it(tmp_path, monkeypatch):
    """The holder writes its record just after the OS lock is taken; a waiter arriving in that window waits
    for the record instead of saying 'another process' (a flaky CI failure before the settle)."""
    path = tmp_path / "r.lock"
    written = FileLock._write_holder
    entered = threading.Event()

    def late(fd):
        entered.set()
        time.sleep(0.3)
        written(fd)

    monkeypatch.setattr(FileLock, "_write_holder", staticmethod(late))
    holder = FileLock(path, "stage 'r'")
    taker = threading.Thread(target=holder.acquire)
    taker.start()
    assert entered.wait(10)
    messages: list = []
    monkeypatch.setattr(FileLock, "_write_holder", staticmethod(written))
    other = FileLock(path, "stage 'r'", on_wait=messages.append)
    try:
        with pytest.raises(LockTimeout):
            other.acquire(timeout=0.1, poll=0.02)
        assert messages and f"is in use by pid {os.getpid()} on" in messages[0]
    finally:
        taker.join()
        holder.release()


def test_file_lock_of_a_killed_holder_is_free_and_names_it_while_alive(tmp_path):
    """The lock is the OS's (``filelock``'s native lock, no soft fallback): a holder killed with SIGKILL leaves
    no stale lock, and while it lives a waiter reads its record from the lock file."""
    path = tmp_path / "k.lock"
    code = (f"import sys, time; from specmoe.utils.files import FileLock; lock = FileLock({str(path)!r}).acquire(); "
            f"print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        other = FileLock(path, "stage 'k'", on_wait=lambda msg: None)
        assert other.is_held_elsewhere() and other.holder()["pid"] == proc.pid
        with pytest.raises(LockTimeout, match=rf"stage 'k' is in use by pid {proc.pid} on"):
            other.acquire(timeout=0, poll=0.01)
    finally:
        proc.kill()
        proc.wait()
    mine = FileLock(path, "stage 'k'").acquire(timeout=0)
    assert mine.holder()["pid"] == os.getpid()
    mine.release()
    assert path.is_file() and not FileLock(path).is_held_elsewhere()


@pytest.fixture
def clean_env(monkeypatch):
    for var in LAUNCH:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_dist_info_single_torchrun_slurm_and_by_hand(clean_env):
    assert dist_info() == dist_info().__class__()  # a plain process: rank 0 of 1
    for k, v in {"TORCHELASTIC_RUN_ID": "r1", "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                 "GROUP_RANK": "1"}.items():
        clean_env.setenv(k, v)
    info = dist_info()
    assert (info.rank, info.world, info.local_rank, info.node_rank, info.launcher) == (3, 8, 1, 1, "torchelastic")
    for k in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK"):
        clean_env.delenv(k)
    for k, v in {"SLURM_NTASKS": "4", "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
                 "SLURM_JOB_NAME": "train", "SLURM_NTASKS_PER_NODE": "2"}.items():
        clean_env.setenv(k, v)
    info = dist_info()
    assert (info.rank, info.world, info.local_rank, info.node_rank, info.launcher) == (2, 4, 0, 1, "slurm")
    for k in ("SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_NAME",
              "SLURM_NTASKS_PER_NODE"):
        clean_env.delenv(k)
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "2")
    info = dist_info()
    assert (info.rank, info.world, info.launcher) == (1, 2, "env")


def test_wait_for_ends_on_failure_or_timeout(tmp_path):
    with pytest.raises(WaitTimeout, match="never came"):
        wait_for(tmp_path / "never", "the index", timeout=0.2, poll=0.05)
    reason = {"msg": None}
    threading.Timer(0.2, lambda: reason.update(msg="RuntimeError: CUDA out of memory")).start()
    t0 = time.monotonic()
    with pytest.raises(RankFailed, match="CUDA out of memory"):
        wait_for(tmp_path / "never", "stage 'x'", failed=lambda: reason["msg"], timeout=30, poll=0.05)
    assert time.monotonic() - t0 < 5
    (tmp_path / "there").touch()
    wait_for(tmp_path / "there", "a file", timeout=1)


def test_worker_rank_stops_waiting_when_rank0_records_a_failure(tmp_path, clean_env):
    """A non-distributed stage runs on rank 0; a rank that waits for it ends when rank 0 records a failure."""
    from specmoe.config.load import load_recipe
    from specmoe.interfaces.stage import StageContext
    from specmoe.stages.runner import StageRunner
    from specmoe.stages.state import write_state

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\nimports: [fixtures.stages]\nstages:\n  - {{id: a, name: test_controlled, "
                      f"control: {tmp_path}/a.json}}\n")
    cfg = load_recipe(recipe)
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "2")
    runner = StageRunner(cfg.stages, tmp_path / "cache")
    out = runner.out_dir("a")
    out.mkdir(parents=True)
    threading.Timer(0.5, lambda: write_state(out, "failed", reason="RuntimeError: boom")).start()
    t0 = time.monotonic()
    with pytest.raises(RankFailed, match="boom"):
        runner.run(StageContext())
    assert time.monotonic() - t0 < 10
