# SPDX-License-Identifier: Apache-2.0
"""One evaluation cell: a method on a dataset at one (temperature, gamma, batch size).

Warm-up generations come first (untimed). Multi-turn samples (MT-Bench) generate each turn after the previous
answer; a sample's tokens and time are summed over its turns (Spec-Bench per-question tok/s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from specmoe.decoding.records import summarize
from specmoe.decoding.stopping import StopRule
from specmoe.evaluation.method import Method
from specmoe.interfaces.dataset import Sample

__all__ = ["CellSpec", "run_cell"]


@dataclass
class CellSpec:
    """Coordinates of a cell."""

    method: str
    dataset: str
    temperature: float
    budget: int
    batch_size: int

    def tags(self) -> dict[str, str]:
        return {"specmoe.method": self.method, "specmoe.dataset": self.dataset,
                "specmoe.temperature": str(self.temperature), "specmoe.budget": str(self.budget),
                "specmoe.batch_size": str(self.batch_size)}


def run_cell(method: Method, samples: Sequence[Sample], render: Callable[[Sample, int, list[str]], list[int]],
             decode: Callable[[list[int]], str], spec: CellSpec, *, steps: int, top_k: int, stop: StopRule,
             warmup: int, seed: int, progress: Any = None) -> dict[str, Any]:
    """Run the cell and return a JSON-able result (metrics, per-sample records, outputs, step records).

    Args:
        render: ``(sample, turn_index, previous_answers) -> prompt token ids``.
        decode: token ids -> text.
    """
    kw = dict(budget=spec.budget, steps=steps, top_k=top_k, temperature=spec.temperature, stop=stop)
    for w in range(warmup):
        method.generate([render(samples[0], 0, [])], seed=seed + 10_000 + w, **kw)
    gens, per_sample, outputs = [], [], []
    bsz = spec.batch_size
    for start in range(0, len(samples), bsz):
        batch = list(samples[start:start + bsz])
        answers: list[list[str]] = [[] for _ in batch]
        tokens: list[list[list[int]]] = [[] for _ in batch]
        seconds = 0.0
        n_turns = max(len(s.turns) for s in batch)
        for turn in range(n_turns):
            rows = [i for i, s in enumerate(batch) if turn < len(s.turns)]
            prompts = [render(batch[i], turn, answers[i]) for i in rows]
            gen = method.generate(prompts, seed=seed + start * 31 + turn, **kw)
            gens.append(gen)
            seconds += gen.wall_time
            for i, toks in zip(rows, gen.tokens):
                tokens[i].append(toks)
                answers[i].append(decode(toks))
        new = sum(len(t) for rows_ in tokens for t in rows_)
        for i, s in enumerate(batch):
            per_sample.append({"id": s.id, "new_tokens": sum(len(t) for t in tokens[i]), "seconds": seconds,
                               "batch_tokens_per_s": new / seconds if seconds > 0 else 0.0})
            outputs.append({"id": s.id, "turns": answers[i], "tokens": tokens[i]})
        if progress is not None:
            progress.update(len(batch))
    t = method.target
    metrics = summarize(gens, t.bytes_per_expert_stored, t.num_moe_layers, t.bytes_per_expert)
    # Spec-Bench: mean over questions (here over batches) of tokens / wall time
    batch_tps = [r["batch_tokens_per_s"] for r in per_sample[::bsz]]
    metrics["tokens_per_s"] = sum(batch_tps) / len(batch_tps) if batch_tps else 0.0
    counts = None
    for g in gens:
        if g.expert_counts is not None:
            counts = g.expert_counts if counts is None else [[a + b for a, b in zip(r1, r2)]
                                                              for r1, r2 in zip(counts, g.expert_counts)]
    return {"spec": spec.__dict__, "metrics": metrics, "per_sample": per_sample, "outputs": outputs,
            "steps": [s.to_dict() for g in gens for s in g.steps], "expert_counts": counts,
            "analysis_only": method.analysis_only, "autoregressive": method.is_autoregressive}
