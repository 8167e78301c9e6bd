# SPDX-License-Identifier: Apache-2.0
"""Which precision is faster on this CPU for the work at hand: measured once per CPU model, then read.

Native bf16 is not always faster, so ``precision: auto`` (:func:`cpu_decision`) times a small MoE LM step in
both, by thread CPU time (bf16 only below :data:`BF16_MARGIN` x float32), and keeps the decision per machine and
work kind under ``$XDG_CACHE_HOME/specmoe/precision/`` so cache keys do not flip (delete the logged file to re-measure).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = ["cpu_identity", "cpu_decision", "decision_path", "measure_training", "BF16_MARGIN", "WORK_PROBES"]

log = logging.getLogger(__name__)

#: bf16 is chosen only when its time is at most this fraction of the float32 time
BF16_MARGIN = 0.9

#: work kind -> probe settings: a two-layer GPT-OSS MoE LM of the demo target's width, a batch of 2 x ``seq``
WORK_PROBES: dict[str, dict[str, Any]] = {
    "train_moe_lm": dict(hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
                         sliding_window=128, vocab_size=4096, batch=2, seq=256, iters=3),
}

_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2", "bf16")


def cpu_identity() -> dict[str, str]:
    """What the decision depends on: CPU model, its bf16-relevant flags, architecture and torch version."""
    import torch

    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "cpu model", "hardware") and not model:
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {"cpu": model or os.uname().machine, "flags": " ".join(f for f in _FLAGS if f in flags),
            "machine": os.uname().machine, "torch": torch.__version__.split("+")[0]}


def decision_path(work: str, identity: dict[str, str] | None = None) -> Path:
    """The decision file of ``work`` on this machine (``$XDG_CACHE_HOME/specmoe/precision/<work>-<key>.json``)."""
    from specmoe.utils.hashing import stable_hash

    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specmoe" / "precision"
    return root / f"{work}-{stable_hash(identity or cpu_identity(), 16)}.json"


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure_training(work: str = "train_moe_lm", **overrides: Any) -> dict[str, float]:
    """``{"32-true": s, "bf16-mixed": s}``: median thread CPU seconds per forward + backward of the ``work``
    probe (``bf16-mixed``: float32 weights under bf16 autocast, as Lightning runs it)."""
    import statistics

    import torch
    import transformers

    from specmoe.models.tiny import tiny_config

    spec = {**WORK_PROBES[work], **overrides}
    batch, seq, iters = spec.pop("batch"), spec.pop("seq"), spec.pop("iters")
    with _one_thread():
        torch.manual_seed(0)
        model = transformers.GptOssForCausalLM(tiny_config("gpt_oss", **spec))
        model.train()
        ids = torch.randint(0, spec["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(0))

        def step(mode: str) -> float:
            model.zero_grad(set_to_none=True)
            t0 = time.thread_time()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16-mixed"):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            return time.thread_time() - t0

        times: dict[str, list[float]] = {"32-true": [], "bf16-mixed": []}
        for i in range(iters + 1):
            for mode in times:
                t = step(mode)
                if i:
                    times[mode].append(t)
    return {mode: statistics.median(v) for mode, v in times.items()}


def _decide(times: dict[str, float]) -> str:
    return "bf16-mixed" if times["bf16-mixed"] <= BF16_MARGIN * times["32-true"] else "32-true"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("decision") in ("32-true", "bf16-mixed") else None


def cpu_decision(work: str = "train_moe_lm", measure: Callable[[str], dict[str, float]] | None = None) -> str:
    """``32-true`` or ``bf16-mixed`` for ``work`` on this CPU, from its decision file or measured
    (``measure``, default :func:`measure_training`). The caller checks first that the CPU has native bf16."""
    identity = cpu_identity()
    path = decision_path(work, identity)
    found = _read(path)
    if found is not None:
        return found["decision"]
    with _locked(path):
        found = _read(path)  # another process may have measured while this one waited
        if found is not None:
            return found["decision"]
        times = (measure or measure_training)(work)
        decision = _decide(times)
        record = {"decision": decision, "work": work, "seconds_per_step": times, "margin": BF16_MARGIN,
                  "identity": identity, "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, path)
    log.info("precision auto on %s: %s (float32 %.3f s, bf16-mixed %.3f s per probe step); decision kept in %s",
             identity["cpu"], decision, times["32-true"], times["bf16-mixed"], path)
    return decision
