# SPDX-License-Identifier: Apache-2.0
"""The train_predictor stage under torchrun on CPU (gloo): 1 vs 2 processes, kill + resume, 2 "nodes".

This file is also the worker script: ``torchrun ... test_predictor_ddp.py --traces T --out O --results R``
runs the real ``train_predictor`` stage in every process and writes each rank's summary to ``R/rank<r>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

EPOCHS = 6
GLOBAL_BATCH = 8


# ---------------------------------------------------------------------------------------------- worker
def _worker() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--traces", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--results", required=True)
    p.add_argument("--ckpt-every", type=int, default=None)
    a = p.parse_args()
    import torch

    from specmoe.interfaces.stage import StageContext
    from specmoe.registry import stages

    torch.set_num_threads(1)
    Path(a.results).mkdir(parents=True, exist_ok=True)
    (Path(a.results) / f"pid{os.environ.get('RANK', 0)}").write_text(str(os.getpid()))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    trainer = {"accelerator": "cpu", "devices": local, "num_nodes": world // local,
               "strategy": "ddp" if world > 1 else "auto", "max_epochs": EPOCHS, "num_threads": 1,
               "enable_progress_bar": False, "log_every_n_steps": 1}
    cls = stages.get("train_predictor")
    stage = cls(cls.Config(traces=a.traces, lr=3e-3, max_len=16, batch_size=GLOBAL_BATCH // world,
                           milestones=[], checkpoint_every_n_steps=a.ckpt_every, trainer=trainer))
    summary = stage.run(Path(a.out), StageContext())
    (Path(a.results) / f"rank{os.environ.get('RANK', 0)}.json").write_text(json.dumps(summary))


# ---------------------------------------------------------------------------------------------- launching
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(launch: list[str], traces: Path, out: Path, results: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", *launch, str(Path(__file__).resolve()),
           "--traces", str(traces), "--out", str(out), "--results", str(results), *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _wait(proc: subprocess.Popen, timeout: float = 240) -> None:
    log, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, log[-4000:]


def _ranks(results: Path, n: int) -> list[dict]:
    return [json.loads((results / f"rank{r}.json").read_text()) for r in range(n)]


@pytest.fixture(scope="module")
def traces(make_target, tmp_path_factory):
    from specmoe.interfaces.dataset import Sample
    from specmoe_plugins.stages.collect_traces.collect import CollectOptions, collect_traces

    samples = [Sample(id=f"q{i}", turns=[f"Q{i}: what is {i} + {2 * i}?"]) for i in range(24)]
    out = tmp_path_factory.mktemp("ddp_traces")
    collect_traces(make_target("qwen3_moe"), samples, out,
                   CollectOptions(max_new_tokens=16, batch_size=8, samples_per_shard=8, progress=False))
    return out


@pytest.fixture(scope="module")
def single(traces, tmp_path_factory):
    """The 1-process reference run (checkpoint every step, as the killed run below)."""
    root = tmp_path_factory.mktemp("single")
    _wait(_torchrun(["--standalone", "--nproc_per_node", "1"], traces, root / "out", root / "res",
                    "--ckpt-every", "1"))
    return _ranks(root / "res", 1)[0]


# ---------------------------------------------------------------------------------------------- tests
@pytest.mark.integration
def test_two_process_ddp_matches_one_process(traces, single, tmp_path):
    _wait(_torchrun(["--standalone", "--nproc_per_node", "2"], traces, tmp_path / "out", tmp_path / "res"))
    r0, r1 = _ranks(tmp_path / "res", 2)
    assert r0["world_size"] == 2 and r0["weights_sha256"] == r1["weights_sha256"]
    assert r0["val_acc"] == r1["val_acc"]
    assert r0["global_step"] == single["global_step"]  # same global batches
    assert abs(r0["val_acc"] - single["val_acc"]) < 0.01, (r0["val_acc"], single["val_acc"])
    print(f"1 process: val_acc={single['val_acc']:.6f} steps={single['global_step']}; "
          f"2 processes: val_acc={r0['val_acc']:.6f} steps={r0['global_step']}")


@pytest.mark.integration
def test_killed_run_resumes_to_the_same_steps_and_weights(traces, single, tmp_path):
    import torch

    out = tmp_path / "out"
    one = ["--standalone", "--nproc_per_node", "1"]
    proc = _torchrun(one, traces, out, tmp_path / "res", "--ckpt-every", "1")
    last, killed_at, t0 = out / "checkpoints" / "last.ckpt", None, time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < 240:
        if last.is_file():
            try:
                step = torch.load(last, map_location="cpu", weights_only=False)["global_step"]
            except Exception:  # noqa: BLE001 - not yet readable
                step = 0
            if step >= 3:  # kill the training process itself (as a crash would), no cleanup
                os.kill(int((tmp_path / "res" / "pid0").read_text()), signal.SIGKILL)
                killed_at = step
                break
        time.sleep(0.05)
    proc.communicate()
    assert killed_at is not None and proc.returncode != 0, "the run finished before it could be killed"
    saved = torch.load(last, map_location="cpu", weights_only=False)["global_step"]
    assert saved < single["global_step"]  # really mid-training
    _wait(_torchrun(one, traces, out, tmp_path / "res", "--ckpt-every", "1"))
    resumed = _ranks(tmp_path / "res", 1)[0]
    assert resumed["global_step"] == single["global_step"]
    assert resumed["weights_sha256"] == single["weights_sha256"]  # same batches in the same order
    assert resumed["val_acc"] == single["val_acc"]
    same = resumed["weights_sha256"] == single["weights_sha256"]
    print(f"killed after step {killed_at} (last.ckpt at step {saved}); "
          f"resumed: steps={resumed['global_step']} "
          f"val_acc={resumed['val_acc']:.6f}, uninterrupted: steps={single['global_step']} "
          f"val_acc={single['val_acc']:.6f}, weights equal: {same}")


@pytest.mark.integration
def test_two_nodes_on_localhost_train_and_agree(traces, single, tmp_path):
    port = str(_free_port())
    procs = [_torchrun(["--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(r), "--master_addr",
                        "127.0.0.1", "--master_port", port], traces, tmp_path / "out", tmp_path / "res")
             for r in range(2)]
    for p in procs:
        _wait(p)
    r0, r1 = _ranks(tmp_path / "res", 2)
    assert r0["world_size"] == r1["world_size"] == 2
    assert r0["weights_sha256"] == r1["weights_sha256"] and r0["val_acc"] == r1["val_acc"]
    assert r0["global_step"] == single["global_step"]
    assert abs(r0["val_acc"] - single["val_acc"]) < 0.01
    assert (tmp_path / "out" / "predictor" / "model.safetensors").is_file()
    print(f"2 nodes x 1 process: val_acc={r0['val_acc']:.6f} (both ranks), steps={r0['global_step']}")


if __name__ == "__main__":
    _worker()
