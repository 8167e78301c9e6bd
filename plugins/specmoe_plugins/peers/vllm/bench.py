# SPDX-License-Identifier: Apache-2.0
"""specmoe against vLLM on the same checkpoints and prompts, in one run (``platform bench peer``).

On a target and an EAGLE-3 draft (``--target``, ``--drafter-path``: e.g. the demo's ``pretrain_target`` and
``train_eagle3`` stage directories) and benchmark prompts (default: 16 GSM8K test questions, zero-shot,
rendered to token ids by specmoe's tokenizer and given to vLLM as ids), greedy, batch 1, it measures:

* **vLLM** (its own environment, ``--vllm-python``; ``docker/vllm_env.sh`` makes it), run by subprocess through
  :mod:`specmoe_plugins.peers.vllm.vllm_runner`: no speculation and EAGLE-3 with 1..``--max-drafts`` draft tokens;
* **specmoe**: ``ar``, EAGLE-3 chains of n drafts (``budget = n + 1, steps = n, top_k = 1``) for the same n,
  trees at γ 4 and 5 from the top-2 pool and at γ 4, 5 and 6 from the width-1 pool (``--tree-shapes``) with
  ``confidence`` and ``ecospec``, raw and calibrated (``platform bench tree``'s ``measure``), and ``goodput`` (the
  largest tree's pool and budget as γ_max, the online cost model from its uncalibrated prior, as ``platform bench
  goodput`` builds it without a cost model).

**The vLLM plugin** (``plugins/specmoe_vllm``, installed into vLLM's environment by ``docker/vllm_env.sh``):
with ``--plugin-policy FILE`` (a policy file, ``platform peer export-policy``) or ``--token-table DIR`` (a
``build_token_table`` stage; optionally ``--cost-model`` from ``calibrate_cost``: the bench then writes the
policy after each pass's fixed runs, its cost refitted on vLLM's own fixed-draft-count steps), vLLM runs EAGLE-3
with up to ``--max-drafts`` drafts under ``SpecMoEScheduler`` (rows ``vllm/plugin``, and ``vllm/plugin_tokens``:
the token-only variant), next to its fixed draft counts. ``--batches`` and ``--temperatures`` add cells (rows
``<name>/b<B>_T<T>``; batch 1, T = 0 keeps the plain names) for vLLM; specmoe's rows are batch 1, T = 0. Per
plugin row: the ratio to the best fixed configuration of its cell (no speculation or 1..n drafts) and the budget
check (vLLM's per-request verified drafts against the plugin's choices; 0 violations expected). Per pass, the
**headroom** of any per-step draft count at batch 1, T = 0 (:mod:`specmoe_plugins.peers.vllm.headroom`): a replay
of the longest fixed chain's steps that prices an oracle and a rule on each request's last step against the best
fixed count, the step cost a line fitted on the fixed chains' runs.

Rows are aligned by verified tokens per step γ (vLLM's ``num_speculative_tokens`` n = specmoe's γ - 1). Per row:
tokens/s (wall clock, batch 1, prefill included, as vLLM's runner measures), tokens per step (bonus included),
per-position acceptance (share of speculative steps that accepted at least d drafts; vLLM's
``accepted_per_pos / drafts``), greedy agreement with vLLM's no-speculation outputs (share of prompts whose
output is identical: the same tokens up to the shorter one's end at an EOS) and with the same engine's own
no-speculation outputs (specmoe's losslessness; in bf16 the two engines' kernels round differently, so their
greedy outputs may part where two logits nearly tie), and the ratio to vLLM's best
tokens/s. Both engines stop at the target's EOS ids or after ``--new-tokens``.

**Load.** The engines are measured in ``--passes`` alternating passes (vLLM, specmoe, vLLM, specmoe, ...), each
pass every method on every prompt; per row the pass with the higher tokens/s is kept, with its own tokens per
step and acceptance (greedy chains are identical across passes; calibrated selectors learn within a pass). So
background load that comes and goes hits both engines alike, and each keeps its least-disturbed pass. Within a
vLLM pass the configurations (fixed counts and plugin variants) run side by side in one process, in turn per
prompt batch (``--vllm-order interleaved``, the default): on a shared cloud machine a process's speed drifts over
minutes, which one-engine-after-the-other measurement (``sequential``) charges to whichever configuration ran
then. The plugin's policy is then refitted on the previous pass's fixed runs (pass 0: on a
calibration run first). One thread per engine (``--threads``; vLLM: ``OMP_NUM_THREADS``,
``VLLM_CPU_OMP_THREADS_BIND=nobind``).

Results go to MLflow (experiment ``bench_peer``; ``--tracking-uri``, default ``$MLFLOW_TRACKING_URI`` or
``./mlflow.db``; ``--no-tracking``) and, with ``--json``, to a file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from specmoe_plugins.peers.vllm import headroom

__all__ = ["add_arguments", "run", "measure", "agreement", "check_draft"]

RUNNER = Path(__file__).with_name("vllm_runner.py")
DEFAULT_TREES = "tree4=4/3/2,tree5=5/4/2,tree4w1=4/3/2/1,tree5w1=5/4/2/1,tree6w1=6/5/2/1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from specmoe.bench.target import add_prompt_arguments

    p.add_argument("--target", help="target checkpoint directory (HF save_pretrained, with a tokenizer)")
    p.add_argument("--drafter-path", help="EAGLE-3 draft directory (specmoe's export: config.json + "
                                          "model.safetensors), read by both engines")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--engines", default="vllm,specmoe", help="engines to run: vllm, specmoe or both")
    p.add_argument("--vllm-python", default=None,
                   help="python of vLLM's own environment (default: $SPECMOE_VLLM_PYTHON)")
    p.add_argument("--max-drafts", type=int, default=5, help="EAGLE-3 chains of 1..this many drafts (both engines)")
    p.add_argument("--tree-shapes", default=DEFAULT_TREES,
                   help="specmoe trees, name=budget/steps/top_k[/frontier] (bench tree's --shapes); '' for none")
    p.add_argument("--selectors", default="confidence,ecospec", help="tree selectors, each raw and calibrated")
    p.add_argument("--verifier", default="",
                   help="specmoe's experts implementation for every method, ar included (a verifier plugin, e.g. the "
                        "demo's; '' = the model's own)")
    p.add_argument("--warmup", type=int, default=4,
                   help="untimed generations per specmoe tree / chain method first (bench tree's --warmup)")
    p.add_argument("--goodput", default="{}", help="goodput selector options as JSON ('' to leave goodput out)")
    p.add_argument("--plugin-policy", default=None, help="the vLLM plugin's policy file (platform peer export-policy)")
    p.add_argument("--token-table", default=None,
                   help="build_token_table stage directory: the bench exports the plugin's policy per pass")
    p.add_argument("--cost-model", default=None, help="calibrate_cost's cost_model.json for that policy (optional)")
    p.add_argument("--plugin-variants", default="plugin,plugin_tokens",
                   help="plugin rows: plugin (expert-aware), plugin_tokens (token-only), plugin_noskip "
                        "(expert-aware, the drafter run on steps that propose nothing)")
    p.add_argument("--plugin-clock", default="process", choices=("process", "wall"),
                   help="how the plugin's online cost refit times vLLM's steps: the engine process's CPU time "
                        "(default: load-independent on a shared machine) or wall clock")
    p.add_argument("--vllm-order", default="interleaved", choices=("interleaved", "sequential"),
                   help="vLLM's configurations per pass: every engine in one process, measured in turn per prompt "
                        "batch (default: a drift of the machine's speed hits all alike), or one engine after the "
                        "other")
    p.add_argument("--batches", default="1", help="vLLM batch sizes (requests per generate call), e.g. 1,4,8")
    p.add_argument("--temperatures", default="0", help="vLLM sampling temperatures, e.g. 0,1")
    p.add_argument("--predictor", default="router_on_embedding", help="expert predictor of ecospec / goodput")
    p.add_argument("--predictor-path", default=None)
    add_prompt_arguments(p)  # the same prompt options as bench tree: both choose prompts alike
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--passes", type=int, default=2, help="alternating passes per engine; the faster is kept")
    p.add_argument("--threads", type=int, default=1, help="threads per engine (torch; vLLM's OMP_NUM_THREADS)")
    p.add_argument("--tracking-uri", default=None, help="MLflow URI (default: $MLFLOW_TRACKING_URI or ./mlflow.db)")
    p.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--keep-dir", default=None,
                   help="keep vLLM's request / output files and the plugin's policies in this folder (default: a "
                        "temporary one), e.g. to refit the plugin's step cost offline (platform peer export-policy "
                        "--vllm-run DIR/vllm_out_0.json)")


# ------------------------------------------------------------------ input checks


def _engines(args: argparse.Namespace) -> list[str]:
    from specmoe.errors import UserError

    names = [e.strip() for e in args.engines.split(",") if e.strip()]
    bad = [e for e in names if e not in ("vllm", "specmoe")]
    if bad or not names:
        raise UserError(f"bench peer: --engines {args.engines!r}: give vllm, specmoe or vllm,specmoe")
    return names


def check_draft(path: str) -> None:
    """The draft directory is an EAGLE-3 export vLLM reads: one clear message otherwise (an old specmoe export
    with repeated aux layer ids is refused with the rewrite command)."""
    from specmoe.errors import UserError

    cfg_path = Path(path) / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"bench peer: --drafter-path {path}: cannot read {cfg_path} ({exc}); give the "
                        f"directory of an EAGLE-3 export (config.json + model.safetensors)") from None
    ids = cfg.get("eagle_aux_hidden_state_layer_ids") or (cfg.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    if ids and len(set(ids)) < len(ids):
        raise UserError(
            f"bench peer: --drafter-path {path} is an old-format specmoe EAGLE-3 export: its "
            f"eagle_aux_hidden_state_layer_ids {ids} repeat a layer, which vLLM cannot serve (it de-duplicates "
            f"them and the fc no longer fits). Rewrite it in the serving convention (same function, fc folded) "
            f"and pass the new directory: python -m specmoe_plugins.drafters.eagle3.checkpoint {path} NEW_DIR")


def _vllm_python(args: argparse.Namespace) -> str:
    from specmoe.errors import UserError

    py = args.vllm_python or os.environ.get("SPECMOE_VLLM_PYTHON", "")
    if not py:
        raise UserError("bench peer: no vLLM environment: create it with `bash docker/vllm_env.sh` (it prints its "
                        "python) and pass --vllm-python PATH or set SPECMOE_VLLM_PYTHON=PATH; or --engines specmoe")
    if not os.access(py, os.X_OK):
        raise UserError(f"bench peer: --vllm-python / SPECMOE_VLLM_PYTHON {py} is not an executable python; "
                        f"create vLLM's environment with `bash docker/vllm_env.sh` (it prints its python)")
    return py


def _check_args(args: argparse.Namespace) -> list[str]:
    from specmoe.errors import UserError
    from specmoe.registry import benches

    parse_shapes = benches.get("tree").parse_shapes  # bench tree's --shapes, through the registry

    engines = _engines(args)
    for name in ("max_drafts", "passes", "threads", "new_tokens", "prompts"):
        if getattr(args, name) < 1:
            raise UserError(f"bench peer: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.tree_shapes:
        try:
            parse_shapes(args.tree_shapes)
        except UserError as exc:
            raise UserError(f"bench peer: --tree-shapes {args.tree_shapes!r}: {exc}") from None
    if args.goodput:
        try:
            if not isinstance(json.loads(args.goodput), dict):
                raise ValueError("not an object")
        except ValueError as exc:
            raise UserError(f"bench peer: --goodput must be a JSON object of goodput selector options ({exc})") \
                from None
    if not args.target:
        raise UserError("bench peer: give --target (a checkpoint directory both engines read: the demo's "
                        ".specmoe_cache/stages/pretrain_target-*)")
    if not (Path(args.target) / "config.json").is_file():
        raise UserError(f"bench peer: --target {args.target} has no config.json; give an HF checkpoint directory")
    if not args.drafter_path:
        raise UserError("bench peer: give --drafter-path (an EAGLE-3 export both engines read: the demo's "
                        ".specmoe_cache/stages/train_eagle3-*, rewritten if it is old-format)")
    check_draft(args.drafter_path)
    _cells(args)
    variants = [v.strip() for v in args.plugin_variants.split(",") if v.strip()]
    if any(v not in ("plugin", "plugin_tokens", "plugin_noskip") for v in variants):
        raise UserError(f"bench peer: --plugin-variants {args.plugin_variants!r}: give any of plugin, plugin_tokens, "
                        f"plugin_noskip")
    if args.plugin_policy and not Path(args.plugin_policy).is_file():
        raise UserError(f"bench peer: --plugin-policy {args.plugin_policy} does not exist; write one with "
                        f"platform peer export-policy")
    if (args.plugin_policy or args.token_table) and "vllm" not in engines:
        raise UserError("bench peer: the plugin rows run in vLLM: add vllm to --engines")
    if "vllm" in engines:
        args.vllm_python = _vllm_python(args)
    return engines


def _cells(args: argparse.Namespace) -> list[dict[str, Any]]:
    """vLLM's (batch, temperature) cells from --batches x --temperatures."""
    from specmoe.errors import UserError

    try:
        batches = [int(b) for b in str(args.batches).split(",") if b.strip()]
        temps = [float(t) for t in str(args.temperatures).split(",") if t.strip()]
    except ValueError:
        raise UserError(f"bench peer: --batches {args.batches!r} / --temperatures {args.temperatures!r}: give "
                        f"comma-separated numbers, e.g. --batches 1,4,8 --temperatures 0,1") from None
    if not batches or not temps or min(batches) < 1 or min(temps) < 0:
        raise UserError(f"bench peer: --batches must be >= 1 and --temperatures >= 0 (got {args.batches!r}, "
                        f"{args.temperatures!r})")
    return [{"batch": b, "temperature": t} for t in temps for b in batches]


def _suffix(batch: int, temperature: float) -> str:
    return "" if (batch, temperature) == (1, 0.0) else f"/b{batch}_T{temperature:g}"


# ------------------------------------------------------------------ the two engines


def agreement(outputs: list[list[int]], reference: list[list[int]], eos: set[int]) -> float:
    """Share of prompts whose greedy output equals the reference: the same tokens, the shorter one ending
    (at the common length) only where the other stops too, or at an EOS id."""
    same = 0
    for o, r in zip(outputs, reference):
        n = min(len(o), len(r))
        if o[:n] != r[:n]:
            continue
        if len(o) == len(r) or (n and (o if len(o) == n else r)[n - 1] in eos):
            same += 1
    return same / max(len(reference), 1)


def _vllm_order(args: argparse.Namespace) -> str:
    """``--vllm-order``; a caller's namespace built without it (``measure`` called directly) keeps the order of
    before, one engine after the other."""
    return getattr(args, "vllm_order", "sequential")


def run_vllm(args: argparse.Namespace, prompts: list[list[int]], workdir: Path, tag: str,
             configs: list[Any] | None = None) -> dict[str, Any]:
    """One pass of vLLM (every config on every prompt and cell) in its own environment; the runner's JSON.
    ``--vllm-order interleaved``: the configs' engines side by side in one process, measured in turn per prompt
    batch."""
    from specmoe.errors import UserError

    req = {"target": str(Path(args.target).resolve()), "draft": str(Path(args.drafter_path).resolve()),
           "prompts": prompts, "max_new_tokens": args.new_tokens,
           "configs": configs if configs is not None else list(range(args.max_drafts + 1)),
           "cells": _cells(args), "dtype": args.dtype, "repeats": 1, "warmup": 1, "ignore_eos": False,
           "interleave": _vllm_order(args) == "interleaved"}
    rq, out = workdir / f"vllm_request_{tag}.json", workdir / f"vllm_out_{tag}.json"
    rq.write_text(json.dumps(req))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    env.pop("PYTHONPATH", None)  # vLLM's environment has its own transformers: nothing of ours on its path
    proc = subprocess.run([args.vllm_python, str(RUNNER), str(rq), str(out)], env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0 or not out.is_file():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise UserError(f"bench peer: vLLM ({args.vllm_python}) failed with exit status {proc.returncode}:\n{tail}")
    return json.loads(out.read_text())


def plugin_configs(args: argparse.Namespace, workdir: Path, tag: str, fixed_path: Path | None) -> tuple[
        list[dict[str, Any]], str | None]:
    """The plugin's configs (one per variant) and its policy file: given (``--plugin-policy``), or exported from
    the token table / cost model with the step cost refitted on the fixed-draft-count runs in ``fixed_path`` (a
    runner output). No configs without a plugin."""
    from specmoe_plugins.peers.vllm import export

    if not (args.plugin_policy or args.token_table):
        return [], None
    policy = args.plugin_policy
    if not policy:
        pol = export.build_policy(token_table=args.token_table, cost_model=args.cost_model,
                                  vllm_run=str(fixed_path) if fixed_path else None, acceptance=None,
                                  max_drafts=args.max_drafts)
        policy = str(workdir / f"policy_{tag}.json")
        Path(policy).write_text(json.dumps(pol))
    variants = [v.strip() for v in args.plugin_variants.split(",") if v.strip()]
    return [{"name": v, "num_speculative_tokens": args.max_drafts,
             "plugin": {"policy": str(Path(policy).resolve()), "expert_cost": v != "plugin_tokens",
                        "skip_drafter": v != "plugin_noskip", "clock": args.plugin_clock}} for v in variants], policy


def run_vllm_pass(args: argparse.Namespace, prompts: list[list[int]], workdir: Path, k: int) -> list[dict[str, Any]]:
    """Pass ``k`` of vLLM: the fixed configurations and the plugin's variants; the runner outputs.

    Sequential: the fixed configurations, then the plugin with a policy refitted on them (two processes).
    Interleaved: one process, every configuration in turn per prompt batch, the plugin's policy refitted on the
    previous pass's fixed runs (pass 0: on a calibration run of the fixed configurations first, kept out of the
    results), so that no configuration is judged on runs its policy was fitted on either."""
    fixed = list(range(args.max_drafts + 1))
    if _vllm_order(args) != "interleaved":
        out = run_vllm(args, prompts, workdir, str(k), fixed)
        configs, policy = plugin_configs(args, workdir, str(k), workdir / f"vllm_out_{k}.json")
        if not configs:
            return [out]
        plug = run_vllm(args, prompts, workdir, f"plugin_{k}", configs)
        plug["policy"] = json.loads(Path(policy).read_text()).get("cost")
        return [out, plug]
    source = None
    if args.token_table and not args.plugin_policy:
        source = workdir / f"vllm_out_{k - 1}.json"
        if k == 0:
            run_vllm(args, prompts, workdir, "calibration", fixed)
            source = workdir / "vllm_out_calibration.json"
    configs, policy = plugin_configs(args, workdir, str(k), source)
    out = run_vllm(args, prompts, workdir, str(k), fixed + configs)
    if policy:
        out["policy"] = json.loads(Path(policy).read_text()).get("cost")
    return [out]


@contextlib.contextmanager
def _recording() -> Iterator[dict[int, dict[tuple[int, ...], list[int]]]]:
    """Record each SpeculativeEngine's greedy outputs by prompt (engine id -> prompt -> tokens), in the order
    the engines first generate, for the greedy agreement of bench tree's methods (its measure returns none)."""
    from specmoe.decoding.engine import SpeculativeEngine

    seen: dict[int, dict[tuple[int, ...], list[int]]] = {}
    original = SpeculativeEngine.generate

    def generate(self: Any, prompts: Any, **kw: Any) -> Any:
        out = original(self, prompts, **kw)
        rec = seen.setdefault(id(self), {})
        for p, t in zip(prompts, out.tokens):
            rec[tuple(int(x) for x in p)] = [int(x) for x in t]
        return out

    SpeculativeEngine.generate = generate  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        SpeculativeEngine.generate = original  # type: ignore[method-assign]


def _own_loop(fn: Any, prompts: list[list[int]], depth: int) -> dict[str, Any]:
    """ar / goodput over the prompts: tokens/s, tokens per step (all steps: goodput's AR-floor steps count as
    one token), acceptance by position over speculative steps, outputs."""
    tokens = seconds = steps = spec = 0
    hist: list[int] = []
    outputs = []
    for i, p in enumerate(prompts):
        out = fn(p, i)
        outputs.append([int(x) for x in out.tokens[0]])
        tokens += len(out.tokens[0])
        seconds += out.wall_time
        for s in out.steps:
            if not s.accepted:
                continue
            steps += 1
            if getattr(s, "speculative", False):
                spec += 1
                hist.append(s.accepted[0] - 1)
    n = max(spec, 1)
    return {"tok_s": tokens / max(seconds, 1e-12), "tokens": tokens, "steps": steps,
            "tokens_per_step": sum(h + 1 for h in hist) / n if hist else 1.0,
            "ar_step_share": 1 - spec / max(steps, 1),
            "acceptance_by_position": [sum(h >= d for h in hist) / n for d in range(1, depth + 1)],
            "outputs": outputs}


def run_specmoe(target: Any, args: argparse.Namespace, prompts: list[list[int]]) -> dict[str, dict[str, Any]]:
    """One pass of specmoe: ar, chains of 1..max_drafts, bench tree's trees, goodput."""
    from specmoe.bench.drafters import bench_drafter
    from specmoe.bench.target import bench_prompts
    from specmoe.decoding.ar import ar_generate
    from specmoe.decoding.engine import SpeculativeEngine
    from specmoe.decoding.stopping import StopRule
    from specmoe.registry import benches, drafters, predictors, selectors, verifiers

    tree = benches.get("tree")  # bench tree measures specmoe's trees (reached through the registry)

    if getattr(args, "verifier", ""):
        verifiers.get(args.verifier)().install(target)
    stop = StopRule(args.new_tokens, stop_ids=list(target.eos_token_ids))
    rows: dict[str, dict[str, Any]] = {}
    clock = time.perf_counter
    for p in prompts[:max(getattr(args, "warmup", 4), 1)]:  # untimed: the target compiles its decoding passes
        ar_generate(target, [p], temperature=0.0, stop=stop, clock=clock)
    r = _own_loop(lambda p, i: ar_generate(target, [p], temperature=0.0, stop=stop, clock=clock), prompts, 0)
    rows["specmoe/ar"] = {**r, "gamma": 1}

    chains = ",".join(f"chain{n}={n + 1}/{n}/1" for n in range(1, args.max_drafts + 1))
    shapes = ",".join(filter(None, [chains, args.tree_shapes]))
    targs = argparse.Namespace(
        drafter="eagle3", drafter_path=args.drafter_path, predictor=args.predictor,
        predictor_path=args.predictor_path, selectors=args.selectors, shapes=shapes, dataset=args.dataset,
        format=args.format, data_dir=args.data_dir, prompts=args.prompts, random_prompts=args.random_prompts,
        seed=args.seed, new_tokens=args.new_tokens, temperature=0.0, clock="wall",
        warmup=getattr(args, "warmup", 4))
    with _recording() as seen:
        res = tree.measure(target, targs)
    if len(seen) != len(res["methods"]):
        raise RuntimeError(f"bench peer: recorded {len(seen)} engines for {len(res['methods'])} bench tree methods")
    parsed = tree.parse_shapes(shapes)
    for (name, m), rec in zip(res["methods"].items(), seen.values()):
        budget = parsed[name.split("/")[0]][0]
        rows[f"specmoe/{name}"] = {**m, "gamma": budget, "outputs": [rec[tuple(p)] for p in prompts]}

    if args.goodput:
        trees = tree.parse_shapes(args.tree_shapes) if args.tree_shapes else {}
        # the largest tree's pool (its frontier too: the width-1 pool where the largest tree has one)
        budget, steps, top_k, frontier = max((trees or parsed).values(), key=lambda v: v[0])
        if frontier is None:
            drafter = bench_drafter(target, targs)
        else:
            drafter = drafters.get(targs.drafter)(path=args.drafter_path, frontier=frontier)
            drafter.setup(target)
        pred = predictors.get(args.predictor)(**({"path": args.predictor_path} if args.predictor_path else {}))
        pred.setup(target)
        sel = selectors.get("goodput")(**json.loads(args.goodput))
        eng = SpeculativeEngine(target, drafter, sel, pred if sel.needs_experts else None, clock=clock)
        run = lambda p, i: eng.generate([p], budget=budget, steps=steps, top_k=top_k, temperature=0.0,  # noqa: E731
                                        stop=stop, seed=i)
        # untimed, on other prompts of the dataset as bench tree's methods: the drafter compiles its pool's variant
        # (without this, 2-3 s of the first timed generation: goodput@6 179 against 293 tok/s warm) and goodput's
        # models see the regime once, not the prompts they are timed on
        n_warm = max(getattr(args, "warmup", 4), 1)
        for i, p in enumerate(bench_prompts(target, targs, n_warm)[targs.prompts:]):
            run(p, i)
        r = _own_loop(run, prompts, steps)
        rows[f"specmoe/goodput@{budget}"] = {**r, "gamma": budget}
    return rows


def _vllm_rows(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    rows = {}
    for run in out["runs"]:
        n = int(run["num_speculative_tokens"])
        base = run.get("name") or ("no_spec" if n == 0 else f"eagle3_chain{n}")
        for cell in run.get("cells") or [{**run, "batch": 1, "temperature": 0.0}]:
            b, t = int(cell.get("batch", 1)), float(cell.get("temperature", 0.0))
            sizes = [len(o) for o in cell["outputs"]]
            per_batch = [sum(sizes[i:i + b]) / s for i, s in zip(range(0, len(sizes), b), cell.get("seconds", []))
                         if s > 0]
            row = {"gamma": n + 1, "tok_s": cell["tokens_per_s"], "tok_s_cpu": cell.get("tokens_per_cpu_s"),
                   "tokens": cell["tokens"], "tok_s_batches": per_batch,
                   "tokens_per_step": cell.get("tokens_per_step", 1.0), "batch": b, "temperature": t,
                   "acceptance_by_position": cell.get("acceptance_per_pos", []), "outputs": cell["outputs"],
                   "startup_s": run["startup_s"]}
            if "plugin" in cell:
                row["plugin"] = {k: v for k, v in cell["plugin"].items() if k != "per_request"}
            elif n > 0:  # what headroom() replays: the fixed chains' steps and seconds
                row["steps"] = {"seconds": sum(cell.get("seconds", [])), "spec_steps": cell.get("drafts", 0),
                                "accepted": cell.get("per_step_accepted", []),
                                "drafted": cell.get("per_step_drafted", [])}
            rows[f"vllm/{base}{_suffix(b, t)}"] = row
    return rows


def _keep_faster(best: dict[str, dict[str, Any]], rows: dict[str, dict[str, Any]], pass_no: int) -> None:
    for name, row in rows.items():
        row["pass"] = pass_no
        prev = best.get(name)
        row["tok_s_passes"] = [*(prev["tok_s_passes"] if prev else []), row["tok_s"]]
        row["tok_s_batches_passes"] = [*(prev["tok_s_batches_passes"] if prev else []),
                                       row.pop("tok_s_batches", [])]
        if prev is None or row["tok_s"] > prev["tok_s"]:
            best[name] = row
        else:
            prev["tok_s_passes"] = row["tok_s_passes"]
            prev["tok_s_batches_passes"] = row["tok_s_batches_passes"]


def cross_fitted_vs_fixed(plugin: list[list[float]], fixed: dict[str, list[list[float]]],
                          plain: list[list[float]]) -> dict[str, Any] | None:
    """The plugin against the best fixed configuration a user would have picked on other prompts
    (:func:`specmoe.evaluation.stats.cross_fit_ratio`), with a paired bootstrap interval.

    Args:
        plugin, plain: per pass, tokens/s per prompt batch of the plugin and of vLLM without speculation.
        fixed: the same per fixed configuration (no speculation included).

    The observations are the (pass, batch) pairs every configuration ran: one pass's runs follow each other
    within minutes, so a batch of a pass is paired across configurations. The in-sample "best fixed" (the
    fastest of ~6 configurations x passes on the very runs it is judged on) is biased upwards on a noisy
    machine; this is what a user who tuned the draft count gets on new prompts. None where the passes or
    batches do not line up."""
    from specmoe.evaluation.stats import cross_fit_ratio

    names = sorted(fixed)
    shape = [len(b) for b in plain]
    if not names or any([len(b) for b in fixed[n]] != shape for n in names) or [len(b) for b in plugin] != shape:
        return None
    def flat(passes: list[list[float]]) -> list[float]:
        return [x for b in passes for x in b]

    iv = cross_fit_ratio([flat(plugin)], [[flat(fixed[n]) for n in names]], [flat(plain)])
    if iv is None:
        return None
    return {"value": iv.value, "lo": iv.lo, "hi": iv.hi, "n": iv.n}


def pass_headroom(rows: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The batch-1 greedy cell of one vLLM pass: :func:`headroom.headroom` on its longest fixed chain's steps,
    the step cost fitted on its fixed chains, and the replay's check against each chain's measured tokens/s;
    None without two fixed chains there."""
    chains = {row["gamma"] - 1: row for row in rows.values()
              if row.get("steps") and row["batch"] == 1 and row["temperature"] == 0}
    cost = headroom.fit_step_cost({k: (r["steps"]["seconds"], r["steps"]["spec_steps"]) for k, r in chains.items()})
    if cost is None:
        return None
    longest = chains[max(chains)]["steps"]
    h = headroom.headroom(longest["accepted"], longest["drafted"], cost)
    if h is None:
        return None
    h["step_cost_s"] = list(cost)
    acc, drafted = longest["accepted"], longest["drafted"]
    h["replay_vs_measured"] = {str(k): round(headroom.rate(acc, drafted, lambda _state, k=k: k, cost) / r["tok_s"], 4)
                               for k, r in sorted(chains.items()) if r["tok_s"] > 0}
    return h


def compare_rows(best: dict[str, dict[str, Any]], eos: set[int]) -> str | None:
    """Fills each row of ``best`` (name -> the fastest pass's row) with its comparisons: output agreement at T = 0
    with its cell's vLLM no-speculation row (else the batch-1 greedy reference: vLLM's, else specmoe's AR; none when
    neither ran), with its own engine's no-speculation row, its share of the cell's fastest vLLM row, and for a
    plugin row its ratio to the best fixed configuration (cross-fitted, in-sample, by CPU time). Returns the
    batch-1 greedy reference's name (None when neither ran)."""
    ref_name = next((n for n in ("vllm/no_spec", "specmoe/ar") if n in best), None)
    for row in best.values():
        row.setdefault("batch", 1)
        row.setdefault("temperature", 0.0)
    cell_best: dict[tuple[int, float], float] = {}
    fixed_best: dict[tuple[int, float], float] = {}
    fixed_best_cpu: dict[tuple[int, float], float] = {}
    for name, row in best.items():
        if name.startswith("vllm/"):
            c = (row["batch"], row["temperature"])
            cell_best[c] = max(cell_best.get(c, 0.0), row["tok_s"])
            if "plugin" not in row:
                fixed_best[c] = max(fixed_best.get(c, 0.0), row["tok_s"])
                fixed_best_cpu[c] = max(fixed_best_cpu.get(c, 0.0), row.get("tok_s_cpu") or 0.0)
    for name, row in best.items():
        c = (row["batch"], row["temperature"])
        sfx = _suffix(*c)
        if row["temperature"] > 0:  # sampled outputs differ run to run by design
            row["agreement"] = row["agreement_own"] = None
        else:
            ref = best.get(f"vllm/no_spec{sfx}") or (best[ref_name] if ref_name else None)
            row["agreement"] = agreement(row["outputs"], ref["outputs"], eos) if ref else None
            own = f"vllm/no_spec{sfx}" if name.startswith("vllm/") else "specmoe/ar"
            row["agreement_own"] = agreement(row["outputs"], best[own]["outputs"], eos) if own in best else None
        row["vs_vllm_best"] = row["tok_s"] / cell_best[c] if cell_best.get(c) else None
        if "plugin" in row:
            fixed = {n: best[n]["tok_s_batches_passes"] for n in best if n.startswith("vllm/")
                     and "plugin" not in best[n] and (best[n]["batch"], best[n]["temperature"]) == c}
            plain = best.get(f"vllm/no_spec{sfx}")
            row["vs_best_fixed_xfit"] = cross_fitted_vs_fixed(row["tok_s_batches_passes"], fixed,
                                                              plain["tok_s_batches_passes"]) if plain else None
            row["vs_best_fixed"] = row["tok_s"] / fixed_best[c] if fixed_best.get(c) else None
            row["vs_best_fixed_cpu"] = (row["tok_s_cpu"] / fixed_best_cpu[c]
                                        if fixed_best_cpu.get(c) and row.get("tok_s_cpu") else None)
    return ref_name


def measure(target: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Every row of the module docstring: per method gamma, tok_s (best pass), tok_s_passes, tokens_per_step,
    acceptance_by_position, agreement (with vLLM's no-speculation outputs; with specmoe's ar without vLLM),
    agreement_own (with the same engine's no-speculation outputs),
    vs_vllm_best; and the run's settings."""
    import torch

    from specmoe.bench.target import bench_prompts

    engines = _engines(args)
    prompts = bench_prompts(target, argparse.Namespace(
        random_prompts=args.random_prompts, prompts=args.prompts, seed=args.seed, dataset=args.dataset,
        format=args.format, data_dir=args.data_dir))
    best: dict[str, dict[str, Any]] = {}
    meta: dict[str, Any] = {}
    room: list[dict[str, Any]] = []  # per pass (pass_headroom)
    with contextlib.ExitStack() as stack:
        tmp = getattr(args, "keep_dir", None) or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="specmoe_peer_"))
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for k in range(args.passes):
            if "vllm" in engines:
                rows: dict[str, dict[str, Any]] = {}
                for out in run_vllm_pass(args, prompts, Path(tmp), k):
                    meta.update({key: out[key] for key in ("vllm_version", "torch_version", "cpu", "threads")})
                    if "policy" in out:
                        meta["plugin_cost"] = out["policy"]
                    rows.update(_vllm_rows(out))
                h = pass_headroom(rows)
                if h is not None:
                    room.append(h)
                for row in rows.values():
                    row.pop("steps", None)
                _keep_faster(best, rows, k)
            if "specmoe" in engines:
                _keep_faster(best, run_specmoe(target, args, prompts), k)
    ref_name = compare_rows(best, {int(t) for t in target.eos_token_ids})
    order = sorted(best, key=lambda n: (best[n]["temperature"], best[n]["batch"], best[n]["gamma"],
                                        not n.startswith("vllm/"), n))
    return {"rows": {n: best[n] for n in order}, "agreement_reference": ref_name, "prompts": len(prompts),
            "prompt_tokens": sum(len(p) for p in prompts), "new_tokens": args.new_tokens, "dtype": args.dtype,
            "threads": torch.get_num_threads(), "passes": args.passes, "cpu": meta.get("cpu") or _cpu(),
            "torch_version": torch.__version__, "vllm": meta, "target": args.target,
            "drafter_path": args.drafter_path, "headroom": room}


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _report(r: dict[str, Any], args: argparse.Namespace) -> str:
    from specmoe.registry import datasets

    v = r["vllm"]
    source = "random" if getattr(args, "random_prompts", 0) else (args.dataset or datasets.default())
    lines = [f"target {r['target']}  draft {r['drafter_path']}  {r['dtype']}  {source} x {r['prompts']} "
             f"prompts, {r['new_tokens']} new tokens, greedy, batch 1 (vLLM: cells --batches {args.batches} x "
             f"--temperatures {args.temperatures}), threads {r['threads']}, {r['passes']} "
             f"alternating passes (faster kept)  cpu {r['cpu']}  torch {r['torch_version']}"
             + (f"  vLLM {v['vllm_version']} (torch {v['torch_version']})" if v else ""),
             f"{'method':<34} {'γ':>2} {'tok/s':>8} {'vs vLLM best':>12} {'tok/step':>8} {'agree':>6} {'own':>5}  "
             f"accepted >= d drafts (d = 1..)   [tok/s per pass]"]
    def num(x: Any, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    for name, m in r["rows"].items():
        ratio = f"{m['vs_vllm_best']:.3f}x" if m["vs_vllm_best"] is not None else "-"
        lines.append(f"{name:<34} {m['gamma']:>2} {m['tok_s']:8.1f} {ratio:>12} {m['tokens_per_step']:8.3f} "
                     f"{num(m['agreement'], '6.2f'):>6} {num(m['agreement_own'], '5.2f'):>5}  "
                     + " / ".join(f"{x:.2f}" for x in m["acceptance_by_position"])
                     + "   [" + ", ".join(f"{x:.1f}" for x in m["tok_s_passes"]) + "]"
                     + (f"  AR-floor steps {100 * m['ar_step_share']:.0f} %" if "goodput" in name else ""))
    plugin = {n: m for n, m in r["rows"].items() if "plugin" in m}
    if plugin:
        lines.append("vLLM plugin (SpecMoEScheduler) per cell: tok/s vs the best fixed configuration of the cell "
                     "(no speculation, 1..n drafts): cross-fitted (chosen on half of the (pass, prompt batch) "
                     "runs, judged on the other half; 95 % paired bootstrap interval from 5 of them) and "
                     "in-sample (the fastest pass of the fastest configuration: biased upwards), by wall clock "
                     "and by vLLM's CPU time; budget: steps checked / violations; k: verified drafts chosen "
                     "(count per k); k_next: drafts proposed")
        for n, m in plugin.items():
            p = m["plugin"]
            x = m.get("vs_best_fixed_xfit") or {}
            xs = (f"{x['value']:.3f}x" + (f" [{x['lo']:.3f}, {x['hi']:.3f}]" if x.get("lo") is not None else "")
                  if x else "-")
            lines.append(f"  {n:<32} b{m['batch']} T{m['temperature']:g}  cross-fitted {xs} (in-sample "
                         f"{num(m.get('vs_best_fixed'), '.3f')}x, CPU time {num(m.get('vs_best_fixed_cpu'), '.3f')}x)"
                         f"  budget "
                         f"{p['budget_checked_steps']} / {p['budget_violations']}  k {p['k_hist']}  k_next "
                         f"{p['k_next_hist']}")
    if r.get("headroom"):
        lines.append("headroom of a per-step draft count at b1 T0, per pass (a replay of the longest fixed chain's "
                     "steps, over the best fixed count; specmoe_plugins/peers/vllm/headroom.py): oracle, a rule "
                     "on the request's last step [range over halvings], the fitted step cost, replayed / measured "
                     "tokens/s per chain")
        for h in r["headroom"]:
            lines.append(f"  best fixed k {h['best_fixed_k']}  oracle {h['oracle']:.3f}x  last-step rule "
                         f"{h['history']:.3f}x [{h['history_lo']:.3f}, {h['history_hi']:.3f}]  step "
                         f"{1e3 * h['step_cost_s'][0]:.2f} + {1e3 * h['step_cost_s'][1]:.2f} k ms  replayed / "
                         "measured " + " ".join(f"{k}:{v:.3f}" for k, v in h["replay_vs_measured"].items()))
    ref = r["agreement_reference"]
    lines.append("agree (greedy cells): share of prompts with output identical to the cell's vLLM no-speculation "
                 "output" + (f" (where the cell has none: {ref}'s)" if ref else "") + "; own: to the same engine's "
                 "no-speculation output (vllm/no_spec, specmoe/ar)")
    return "\n".join(lines)


def _track(r: dict[str, Any], args: argparse.Namespace) -> str | None:
    from specmoe.peer.compare import ARTIFACT, BENCH_TAG
    from specmoe.tracking.client import Tracker
    from specmoe.tracking.uri import resolve_uri

    uri = args.tracking_uri or resolve_uri(None, Path.cwd())
    tracker = Tracker(uri, "bench_peer")
    params = {k: r[k] for k in ("target", "drafter_path", "dtype", "prompts", "new_tokens", "threads", "passes",
                                "cpu", "torch_version")}
    params.update(vllm_version=(r["vllm"] or {}).get("vllm_version"), engines=args.engines,
                  dataset=args.dataset, max_drafts=args.max_drafts, tree_shapes=args.tree_shapes,
                  batches=args.batches, temperatures=args.temperatures, plugin_policy=args.plugin_policy,
                  token_table=args.token_table, cost_model=args.cost_model,
                  vllm_order=_vllm_order(args))
    tags = {"specmoe.bench": "peer", BENCH_TAG[0]: BENCH_TAG[1]}
    with tracker.run(f"bench_peer_{r['dtype']}", params=params, tags=tags) as h:
        metrics: dict[str, float | None] = {}
        for name, m in r["rows"].items():
            key = name.replace("@", "_at_")
            metrics.update({f"{key}/tok_s": m["tok_s"], f"{key}/tokens_per_step": m["tokens_per_step"],
                            f"{key}/agreement": m["agreement"], f"{key}/vs_best_fixed": m.get("vs_best_fixed"),
                            f"{key}/tok_s_cpu": m.get("tok_s_cpu"),
                            f"{key}/vs_best_fixed_cpu": m.get("vs_best_fixed_cpu"),
                            **{f"{key}/vs_best_fixed_xfit{sfx}": (m.get("vs_best_fixed_xfit") or {}).get(k)
                               for sfx, k in (("", "value"), ("_lower", "lo"), ("_upper", "hi"))},
                            f"{key}/budget_violations": (m.get("plugin") or {}).get("budget_violations"),
                            f"{key}/agreement_own": m["agreement_own"], f"{key}/vs_vllm_best": m["vs_vllm_best"]})
            for d, a in enumerate(m["acceptance_by_position"], 1):
                metrics[f"{key}/acceptance_pos{d}"] = a
        passes = r.get("headroom") or []
        for key in ("oracle", "history", "history_lo", "history_hi") if passes else ():
            metrics[f"headroom/{key}"] = sum(p[key] for p in passes) / len(passes)
        h.log_metrics(metrics)
        h.log_dict({n: {k: v for k, v in m.items() if k != "outputs"} for n, m in r["rows"].items()},
                   ARTIFACT)
        h.log_text(_report(r, args), "bench_peer.txt")
        return h.run_id


def run(args: argparse.Namespace) -> int:
    import torch

    from specmoe.registry import targets

    _check_args(args)
    torch.set_num_threads(args.threads)
    target = targets.get("hf")(path=args.target, device="cpu", dtype=args.dtype)
    r = measure(target, args)
    print(_report(r, args))
    if not args.no_tracking:
        r["mlflow_run_id"] = _track(r, args)
        print(f"logged to MLflow: experiment bench_peer, run {r['mlflow_run_id']}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(r, fh, indent=1, default=str)
    return 0
