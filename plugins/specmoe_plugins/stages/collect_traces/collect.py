# SPDX-License-Identifier: Apache-2.0
"""Collect routing traces: the target generates continuations of dataset prompts, then one causal forward
pass over prompt + continuation records the router's top-K experts of every token at every MoE layer.

The predictor and the drafters see target-generated text at decode time, so the traces hold the target's
own continuations (greedy by default). Samples are split 80/20 into train/test by sample (seeded), grouped
into shards of ``samples_per_shard`` samples, and written shard by shard (see :mod:`specmoe.traces.format`).
Rerunning on a directory with finished shards continues after them. With ``world > 1`` (one process per
GPU under torchrun or SLURM) shard ``i`` is collected by rank ``i % world`` and rank 0 writes the index.
"""

from __future__ import annotations

import logging
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from specmoe.interfaces.dataset import Sample
from specmoe.traces.format import SampleTrace, TraceMeta, TraceWriter
from specmoe.utils.dist import wait_for
from specmoe.utils.hashing import stable_hash

__all__ = ["CollectOptions", "collect_traces", "split_samples", "plan_shards", "encode_turn",
           "route_sequences", "usable_tokenizer", "trace_meta", "summarize"]

logger = logging.getLogger(__name__)


@dataclass
class CollectOptions:
    """How traces are collected (the stage's options: :class:`CollectTraces` in this folder's ``__init__``)."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    batch_size: int = 8
    samples_per_shard: int = 64
    test_fraction: float = 0.2
    seed: int = 0
    max_prompt_tokens: Optional[int] = None
    progress: bool = True


def split_samples(ids: Sequence[str], test_fraction: float, seed: int) -> dict[str, str]:
    """Seeded split by sample: ``round(test_fraction * n)`` ids go to ``test``, the rest to ``train``."""
    order = list(ids)
    random.Random(seed).shuffle(order)
    n_test = int(round(test_fraction * len(order)))
    test = set(order[:n_test])
    return {i: ("test" if i in test else "train") for i in ids}


def plan_shards(ids: Sequence[str], splits: dict[str, str], per_shard: int) -> dict[str, list[str]]:
    """Shard stem (``train-00000``) -> sample ids, in dataset order within each split."""
    plan: dict[str, list[str]] = {}
    for split in ("train", "test"):
        members = [i for i in ids if splits[i] == split]
        for k in range(0, len(members), per_shard):
            plan[f"{split}-{k // per_shard:05d}"] = members[k:k + per_shard]
    return plan


def trace_meta(target: Any, extra: dict[str, Any] | None = None) -> TraceMeta:
    """Shapes of ``target`` (an :class:`~specmoe.interfaces.target.Target`) for the trace index."""
    cfg = getattr(target, "config", None)
    info = {"path": str(getattr(target, "path", "") or "")}
    if cfg is not None:
        info["options"] = asdict(cfg) if hasattr(cfg, "__dataclass_fields__") else {}
    return TraceMeta(num_layers=target.num_moe_layers, num_experts=target.num_experts, top_k=target.top_k,
                     vocab_size=target.vocab_size, hidden_size=target.hidden_size, target=info,
                     extra=dict(extra or {}))


def encode_turn(tokenizer: Any, sample: Sample, turn: int, answers: Sequence[str],
                vocab_size: int) -> list[int]:
    """Prompt token ids of ``sample.turns[turn]`` (chat template / plain rendering of ``specmoe.data``).

    Without a tokenizer (tiny random targets) the UTF-8 bytes of the first turn are the token ids (mod vocab).
    """
    if tokenizer is None:
        return [b % vocab_size for b in sample.turns[0].encode("utf-8")] or [0]
    from specmoe.data.render import render_turn

    return render_turn(tokenizer, sample, turn, answers)


def usable_tokenizer(target: Any) -> Any:
    """The target's tokenizer, or None when it has none or an empty vocabulary (tiny random models)."""
    tok = getattr(target, "tokenizer", None)
    if tok is None:
        return None
    try:
        return tok if len(tok("a b 1", add_special_tokens=False)["input_ids"]) > 0 else None
    except (TypeError, ValueError, KeyError):
        return None


def route_sequences(target: Any, seqs: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """One causal target pass over each (right-padded) sequence -> per sequence ``[T, L, K]`` routing.

    The target's standard pass runs without its LM head (no ``[B, T, V]`` logits: they would dominate memory
    for large vocabularies).
    """
    from specmoe.decoding.engine import pad_rows

    dev = target.device
    ids, valid = pad_rows(seqs, dev)
    pos = torch.arange(ids.shape[1], device=dev).expand_as(ids)
    routing = target.forward_standard(ids, valid.long(), pos, capture_routing=True, compute_logits=False).routing
    return [routing[i, :len(s)].cpu() for i, s in enumerate(seqs)]


def _generate(target: Any, samples: Sequence[Sample], opts: CollectOptions,
              seed: int) -> list[tuple[list[int], int]]:
    """(prompt + continuation, prompt length) per sample; multi-turn samples answer every turn in order."""
    from specmoe.decoding.ar import ar_generate
    from specmoe.decoding.stopping import StopRule

    tok = usable_tokenizer(target)
    stop = StopRule(opts.max_new_tokens, stop_ids=target.eos_token_ids)
    answers: list[list[str]] = [[] for _ in samples]
    last: list[tuple[list[int], list[int]]] = [([], []) for _ in samples]
    turns = [len(s.turns) if tok is not None else 1 for s in samples]
    for turn in range(max(turns)):
        rows = [i for i in range(len(samples)) if turn < turns[i]]
        prompts = []
        for i in rows:
            p = encode_turn(tok, samples[i], turn, answers[i], target.vocab_size)
            if opts.max_prompt_tokens:
                p = p[-opts.max_prompt_tokens:]
            prompts.append(p)
        gen = ar_generate(target, prompts, temperature=opts.temperature, stop=stop, seed=seed + turn,
                          capture_routing=False)
        for i, p, out in zip(rows, prompts, gen.tokens):
            last[i] = (p, out)
            if tok is not None:
                answers[i].append(tok.decode(out, skip_special_tokens=True))
    return [(p + o, len(p)) for p, o in last]


def _fingerprint(meta: TraceMeta, ids: Sequence[str], splits: dict[str, str], opts: CollectOptions) -> str:
    o = asdict(opts)
    o.pop("progress")
    return stable_hash({"meta": asdict(meta), "ids": list(ids), "splits": splits, "opts": o})


def collect_traces(target: Any, samples: Sequence[Sample], out_dir: str | Path, opts: CollectOptions, *,
                   rank: int = 0, world: int = 1,
                   on_sample: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Trace ``samples`` with ``target`` into ``out_dir`` (resumable; see the module docstring).

    Args:
        target: a loaded :class:`~specmoe.interfaces.target.Target`.
        samples: dataset samples with unique ids.
        out_dir: the trace directory.
        opts: collection options.
        rank, world: this process's share of the shards.
        on_sample: called with the number of samples traced by this call so far (progress hooks; tests
            inject a crash there).

    Returns:
        Summary: samples and tokens per split, shapes.
    """
    from tqdm.auto import tqdm

    out = Path(out_dir)
    ids = [s.id for s in samples]
    if len(set(ids)) != len(ids):
        raise ValueError("sample ids must be unique within a trace collection")
    by_id = {s.id: s for s in samples}
    splits = split_samples(ids, opts.test_fraction, opts.seed)
    plan = plan_shards(ids, splits, opts.samples_per_shard)
    meta = trace_meta(target, {"collect": {k: v for k, v in asdict(opts).items() if k != "progress"}})
    writer = TraceWriter(out, meta, _fingerprint(meta, ids, splits, opts))
    if rank == 0:
        writer.write_plan(plan)
    done = writer.finished()
    mine = [stem for k, stem in enumerate(plan) if k % world == rank and stem not in done]
    total = sum(len(plan[s]) for s in mine)
    if done:
        logger.info("traces: %d of %d shards already finished in %s; continuing", len(done), len(plan), out)
    bar = tqdm(total=total, desc="routing traces", unit="sample", disable=not opts.progress or rank != 0)
    count = 0
    for stem in mine:
        shard_no = list(plan).index(stem)
        members = [by_id[i] for i in plan[stem]]
        traces: list[SampleTrace] = []
        for b in range(0, len(members), opts.batch_size):
            batch = members[b:b + opts.batch_size]
            seqs = _generate(target, batch, opts, seed=opts.seed + 1000 * shard_no + b)
            routing = route_sequences(target, [s for s, _ in seqs])
            for smp, (seq, plen), r in zip(batch, seqs, routing):
                traces.append(SampleTrace(smp.id, torch.tensor(seq, dtype=torch.long), r, plen))
                count += 1
                bar.update(1)
                if on_sample is not None:
                    on_sample(count)
        writer.write_shard(stem, stem.split("-")[0], traces)
    bar.close()
    if rank == 0:
        for stem in plan:
            wait_for(out / f"{stem}.json", f"shard {stem} from another rank")
        writer.write_index(list(plan))
    else:
        wait_for(out / "index.json", "the trace index from rank 0")
    return summarize(out)


def summarize(out_dir: str | Path) -> dict[str, Any]:
    """Small JSON-able description of a finished trace directory."""
    from specmoe.traces.format import TraceReader

    r = TraceReader(out_dir)
    return {"samples": r.splits(), "tokens": {s: r.num_tokens(s) for s in r.splits()},
            "num_layers": r.meta.num_layers, "num_experts": r.meta.num_experts, "top_k": r.meta.top_k}
