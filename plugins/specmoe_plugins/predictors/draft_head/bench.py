# SPDX-License-Identifier: Apache-2.0
"""Expert-predictor time per decoding step: ``draft_head`` at GPT-OSS-120B dimensions, and ``draft_head`` vs
``learned`` at the CPU demo's size.

* ``gptoss120b``: the ``draft_head`` computation of one tree (:func:`.model.predict_sets`:
  the head on the node features, the token terms looked up, top-K per layer, the valid mask) for EAGLE's
  10-candidate pool + root (11 nodes), batch 1, 36 MoE layers x 128 experts, top-4, drafter features and target
  embeddings 2880 wide, a 201,088-token table; random weights (the time does not depend on them). Target:
  0.3 ms on one CPU thread.
* ``demo``: the same pool on the demo's shapes (4 MoE layers x 32 experts, top-4, width 256, 4096 tokens):
  ``draft_head`` as above, and the ``learned`` plugin itself (its decoder over the target embedding: one
  ``observe`` of 3 newly committed tokens and one tree ``predict`` per step, after a 128-token prompt) on a
  random target of the demo's shape, or on ``--target`` / ``--learned`` (e.g. the demo's stage outputs).

Calls are interleaved across cases (machine-load drifts hit all alike); prints the median and p90 per step.
``--device cuda`` times on a GPU (synchronised around every call).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

__all__ = ["add_arguments", "run", "GPTOSS120B", "head_case", "demo_target", "learned_case"]

#: (MoE layers, experts, top-k, drafter feature width, target embedding width, vocabulary)
GPTOSS120B = (36, 128, 4, 2880, 2880, 201088)
#: the demo target (recipes/_base/tiny.yaml: pretrain_target's gpt_oss shape) and its learned predictor
DEMO_TARGET = dict(arch="gpt_oss", hidden_size=256, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
                   sliding_window=128, vocab_size=4096, initializer_range=0.02)
DEMO_BACKBONE = dict(model_type="qwen3", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=32)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (the target is for one)")
    p.add_argument("--heads", default="mlp:64,lowrank:64,mlp:32",
                   help="draft heads to time at GPT-OSS-120B dimensions, KIND:RANK (kind mlp, lowrank or linear)")
    p.add_argument("--demo-head", default="mlp:64", help="the draft head timed at the demo's size")
    p.add_argument("--no-demo", action="store_true", help="skip the demo-size comparison with learned")
    p.add_argument("--target", default=None, help="demo: target checkpoint (default: random, demo shape)")
    p.add_argument("--learned", default=None, help="demo: exported learned predictor (default: random, demo size)")
    p.add_argument("--trees", type=int, default=20, help="random trees per case")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per tree")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", default=".specmoe_cache/bench")


def _pool(bsz: int, vocab: int, gen: Any, device: Any):
    """EAGLE's pool (3 steps x top-2: 10 candidates + root) with random tokens."""
    import torch

    from specmoe.decoding.tree_builder import build_pool

    v = min(vocab, 4096)
    tree = build_pool(torch.randint(0, vocab, (bsz,), generator=gen),
                      torch.log_softmax(torch.randn(bsz, v, generator=gen), -1),
                      lambda t, i, a: torch.log_softmax(torch.randn(*t.shape, v, generator=gen), -1), 3, 2)
    tree.tokens = torch.randint(0, vocab, tree.tokens.shape, generator=gen)
    return tree.__class__(**{k: (x.to(device) if x is not None else None) for k, x in vars(tree).items()})


def head_case(shape: tuple[int, ...], kind: str, rank: int, device: Any, seed: int) -> Callable[[Any], None]:
    """``step(tree)``: one ``draft_head`` prediction of ``tree`` (random weights, features and table)."""
    import torch

    from specmoe_plugins.predictors.draft_head.model import DraftHeadConfig, DraftHeadNet, predict_sets

    layers, experts, top_k, feat, emb, vocab = shape
    torch.manual_seed(seed)
    net = DraftHeadNet(DraftHeadConfig(feat, emb, layers, experts, top_k, kind=kind, rank=rank))
    net = net.to(device).eval().requires_grad_(False)
    table = None
    if kind != "linear":
        table = torch.randn(vocab, rank, device=device) * 0.1
    else:  # the target's embedding rows of the tree's tokens (a gather: a few thousand rows time the same)
        rows = torch.randn(min(vocab, 4096), emb, device=device)
        embedding = lambda ids: rows[ids % rows.shape[0]]  # noqa: E731
    feats: dict[int, Any] = {}

    @torch.no_grad()
    def step(tree: Any) -> None:
        f = feats.get(id(tree))
        if f is None:
            f = feats[id(tree)] = torch.randn(*tree.tokens.shape, feat, device=device)
        predict_sets(net, f, tree.tokens, tree.valid, table, None if table is not None else embedding)

    return step


def demo_target(device: Any, cache_dir: str, target_path: str | None = None) -> Any:
    """The target of the demo comparison: ``target_path``, or a random one of the demo's shape."""
    from specmoe.registry import targets

    if target_path:
        return targets.get("hf")(path=target_path, device=str(device), dtype="float32")
    return targets.get("hf")(tiny=dict(DEMO_TARGET), device=str(device), dtype="float32", cache_dir=cache_dir)


def learned_case(target: Any, device: Any, learned_path: str | None = None) -> Callable[[Any], Any]:
    """``step(tree) -> [1, N, L, E]`` sets: one ``learned`` step (observe 3 tokens, predict the tree) per call;
    an untrained predictor (random weights) at the demo's backbone size unless ``learned_path``."""
    import torch

    from specmoe.interfaces.drafter import Committed
    from specmoe.registry import predictors

    options = {"path": learned_path} if learned_path else {"init": dict(DEMO_BACKBONE)}
    pred = predictors.get("learned")(**options)
    pred.setup(target)
    gen = torch.Generator().manual_seed(1)
    box: dict[str, Any] = {}

    def commit(n: int, first: bool) -> Committed:
        start = box.get("pos", 0)
        ids = torch.randint(0, target.vocab_size, (1, n), generator=gen).to(device)
        box["pos"] = start + n
        pos = torch.arange(start, start + n, device=device)[None]
        return Committed(ids, torch.ones(1, n, dtype=torch.bool, device=device), pos, None, first)

    @torch.no_grad()
    def step(tree: Any) -> Any:
        if "state" not in box or box["pos"] > 1024:  # a new generation: prompt of 128 tokens (untimed part)
            box["pos"] = 0
            box["state"] = pred.begin(1)
            pred.observe(box["state"], commit(128, True))
        pred.observe(box["state"], commit(3, False))
        return pred.predict(box["state"], tree)

    return step


def _timed(fn: Callable[[Any], None], tree: Any, device: Any) -> float:
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *a: None)
    sync(device)
    t0 = time.perf_counter()
    fn(tree)
    sync(device)
    return (time.perf_counter() - t0) * 1e3


def run(args: argparse.Namespace) -> int:
    import torch

    from specmoe.errors import UserError

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: this machine has no CUDA GPU")
    cases: dict[tuple[str, str], tuple[Callable[[Any], None], tuple[int, ...], float | None]] = {}
    for spec in filter(None, args.heads.split(",")):
        kind, _, rank = spec.partition(":")
        cases[("gptoss120b", f"draft_head {kind} r{rank or 0}")] = (
            head_case(GPTOSS120B, kind, int(rank or 0), device, args.seed), GPTOSS120B, 0.3)
    if not args.no_demo:
        kind, _, rank = args.demo_head.partition(":")
        target = demo_target(device, args.cache_dir, args.target)
        learned = learned_case(target, device, args.learned)
        demo = (target.num_moe_layers, target.num_experts, target.top_k, target.hidden_size, target.hidden_size,
                target.vocab_size)
        cases[("demo", f"draft_head {kind} r{rank or 0}")] = (head_case(demo, kind, int(rank or 0), device, args.seed),
                                                             demo, None)
        cases[("demo", "learned")] = (learned, demo, None)
    gen = torch.Generator().manual_seed(args.seed)
    trees = {shape: [_pool(1, shape[5], gen, device) for _ in range(args.trees)]
             for shape in {c[1] for c in cases.values()}}
    for step, shape, _ in cases.values():  # warm-up: first calls allocate
        for _ in range(3):
            step(trees[shape][0])
    times: dict[tuple[str, str], list[float]] = {k: [] for k in cases}
    for t in range(args.trees):
        for _ in range(args.repeats):
            for key, (step, shape, _) in cases.items():
                times[key].append(_timed(step, trees[shape][t], device))
    where = f"{device}" + (f", threads={torch.get_num_threads()}" if device.type == "cpu" else "")
    print(f"# predictor time per step (one tree: EAGLE pool of 10 candidates + root, batch 1), {where}, "
          f"{args.trees} trees x {args.repeats} calls")
    print(f"{'case':<12}{'predictor':<24}{'L x E, K':<14}{'median ms':>10}{'p90 ms':>9}{'target ms':>10}")
    for (case, name), (_, shape, target_ms) in cases.items():
        v = sorted(times[(case, name)])
        med, p90 = statistics.median(v), v[int(0.9 * (len(v) - 1))]
        tgt = f"{target_ms:>10.2f}" if target_ms else f"{'-':>10}"
        print(f"{case:<12}{name:<24}{f'{shape[0]}x{shape[1]}, {shape[2]}':<14}{med:>10.3f}{p90:>9.3f}{tgt}")
    if not args.no_demo:
        h = statistics.median(times[("demo", f"draft_head {kind} r{rank or 0}")])
        print(f"demo: learned / draft_head = {statistics.median(times[('demo', 'learned')]) / h:.1f}x")
    return 0
