# SPDX-License-Identifier: Apache-2.0
"""The target a benchmark runs on, and the common body of the benches that load one (``engine``, ``tree``, the
plugins' ``goodput``, ``peer``): :data:`DEMO`, :func:`run_on_target`, and the prompts they generate from
(:func:`add_prompt_arguments`, :func:`bench_prompts`)."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from specmoe.interfaces.target import Target

__all__ = ["DEMO", "run_on_target", "add_prompt_arguments", "bench_prompts"]

#: the demo target's architecture (``recipes/tiny_gsm8k.yaml``)
DEMO: dict[str, Any] = dict(arch="gpt_oss", seed=0, hidden_size=256, intermediate_size=384, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_local_experts=32,
                            num_experts_per_tok=4, sliding_window=128, initializer_range=0.02, vocab_size=4096,
                            tie_word_embeddings=False)


def run_on_target(args: argparse.Namespace, name: str, measure_fn: Callable[[Any, argparse.Namespace], dict],
                  report: Callable[[dict, argparse.Namespace], str]) -> int:
    """Set threads, check the clock, load ``--target`` (default: the demo architecture, random weights), run
    ``measure_fn``, print ``report`` and write ``--json``: the common body of the target benchmarks."""
    import torch

    from specmoe.errors import UserError
    from specmoe.registry import targets

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "thread" and torch.get_num_threads() != 1:
        raise UserError(f"bench {name}: --clock thread measures this thread's CPU time: add --threads 1")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cls = targets.get(targets.default())
    target = cls(path=args.target, device=device, dtype=args.dtype) if args.target else \
        cls(tiny=dict(DEMO), cache_dir=args.cache_dir, device=device, dtype=args.dtype)
    r = measure_fn(target, args)
    print(report(r, args))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(r, fh, indent=2, default=str)
    return 0


def add_prompt_arguments(p: argparse.ArgumentParser) -> None:
    """The prompt options: ``--dataset``, ``--format``, ``--data-dir``, ``--prompts``, ``--random-prompts``,
    ``--seed`` (:func:`bench_prompts` reads them)."""
    p.add_argument("--dataset", default=None, help="default: the registry's default dataset")
    p.add_argument("--format", default="zeroshot", help="the dataset's prompt format option ('' to leave as is)")
    p.add_argument("--data-dir", default=None, help="default: $SPECMOE_DATA_DIR")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--random-prompts", type=int, default=0,
                   help="instead of the dataset: random token prompts of this length (a target without a tokenizer)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt subset")


def bench_prompts(target: Target, args: argparse.Namespace, extra: int = 0) -> list[list[int]]:
    """The measured prompts (``args.prompts`` of the source), then ``extra`` others of the same source (the
    warm-up's): the measured ones are the same whatever ``extra`` is."""
    import torch

    from specmoe.data.render import render_prompt
    from specmoe.errors import UserError
    from specmoe.registry import datasets

    if args.random_prompts > 0:
        g = torch.Generator().manual_seed(args.seed)
        return [torch.randint(0, target.vocab_size, (args.random_prompts,), generator=g).tolist()
                for _ in range(args.prompts + extra)]
    if target.tokenizer is None:
        raise UserError("bench: the target has no tokenizer to render the prompts with; give --target a "
                        "trained checkpoint directory (the demo's .specmoe_cache/stages/pretrain_target-*) or use "
                        "--random-prompts LENGTH")

    opts: dict[str, Any] = {"seed": args.seed}
    if args.format:
        opts["format"] = args.format
    if args.data_dir or os.environ.get("SPECMOE_DATA_DIR"):
        opts["data_dir"] = args.data_dir or os.environ["SPECMOE_DATA_DIR"]
    dataset = datasets.get(args.dataset or datasets.default())
    samples = dataset(**opts, limit=args.prompts).load()
    if extra:
        ids = {s.id for s in samples}
        more = dataset(**opts, limit=args.prompts + extra).load()
        samples = samples + [s for s in more if s.id not in ids][:extra]
    return [render_prompt(target.tokenizer, s) for s in samples]
