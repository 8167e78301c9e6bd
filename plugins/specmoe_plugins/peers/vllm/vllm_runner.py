# SPDX-License-Identifier: Apache-2.0
"""Run vLLM (the peer engine) on given checkpoints and prompts, and write what it did as JSON.

This file runs **inside vLLM's own virtual environment** (``docker/vllm_env.sh``), executed by path::

    .venv-vllm/bin/python plugins/specmoe_plugins/peers/vllm/vllm_runner.py REQUEST.json OUT.json

It imports nothing from specmoe (vLLM pins another ``transformers``): only vLLM, torch and the standard
library. The request names the checkpoints and prompts; one vLLM engine is started per *config* (no
speculation, or EAGLE-3 with ``num_speculative_tokens`` drafts), each runs every prompt of every cell; one after
the other, or all started first and measured in turn (``interleave``).

Request (JSON object)::

    {
      "target": "/path/to/target",          # HF directory (save_pretrained); a tokenizer there is optional
      "draft": "/path/to/eagle3_draft",      # EAGLE-3 export (config.json + model.safetensors), served as
                                             # it is; needed by configs > 0
      "prompts": [[1, 2, 3], ...],           # token ids (used as they are: no tokenizer is needed)
      "max_new_tokens": 96,
      "configs": [0, 1, 2, 3],               # 0 = no speculation, n > 0 = EAGLE-3 chain of n drafts, or an
                                             # object: {"name": "plugin", "num_speculative_tokens": 5,
                                             #  "plugin": {"policy": "policy.json", "expert_cost": true,
                                             #             "online": true}}: EAGLE-3 with up to n drafts,
                                             # specmoe_vllm's scheduler choosing per step how many to verify
      # plugin options also: "clock": "process" (the online cost refit times steps by CPU time),
      # "skip_drafter": false (every step pays the drafter's pass, vLLM's own way; default true)
      "cells": [{"batch": 1, "temperature": 0.0}],   # per config, the prompts in groups of `batch` requests
                                             # per generate call, sampled at `temperature` (seed per prompt)
      "dtype": "float32",                    # float32 | bfloat16
      "repeats": 1,                          # each prompt timed this many times, the fastest kept
      "interleave": false,                   # true: every config's engine started first, in this process, and
                                             # the configs run in turn per prompt group (order rotated), so
                                             # their ratios are paired in time (needs memory for every engine:
                                             # VLLM_CPU_KVCACHE_SPACE GiB each)
      "warmup": 1,                           # untimed prompts run first on every engine
      "max_model_len": 2048,
      "enforce_eager": true,                 # false: vLLM's torch.compile path (slower start-up)
      "ignore_eos": true,                    # generate exactly max_new_tokens (aligned comparisons)
      "multiprocessing": false,              # true: vLLM's default engine-core process (start-up ~12 s
                                             # longer here); false: the engine runs in this process
      "engine_args": {}                      # more vllm.LLM arguments (tensor_parallel_size, ...), last
    }
    A config object may also carry "speculative": {...}: more speculative_config keys (e.g.
    {"enable_adaptive_verification": true}, with VLLM_USE_V2_MODEL_RUNNER=1 in the environment).

Output (JSON object)::

    {
      "engine": "vllm", "vllm_version": "0.32.0", "torch_version": "...", "dtype": "float32",
      "threads": 1, "cpu": "<model name from /proc/cpuinfo>", "max_new_tokens": 96,
      "runs": [
        {
          "name": "eagle3_chain3",           # no_spec, eagle3_chain<n>, or the config's name
          "num_speculative_tokens": 0,       # the config
          "startup_s": 21.3,                 # LLM(...) construction, wall clock
          "outputs": [[...], ...],           # generated token ids per prompt (greedy)
          "seconds": [0.41, ...],            # per prompt, fastest of `repeats`, wall clock of llm.generate
          "tokens": 1536,                    # generated tokens over all prompts
          "tokens_per_s": 245.1,             # tokens / sum(seconds)
          "cpu_seconds": [...], "tokens_per_cpu_s": 260.3,   # the same by this process's CPU time (one
                                             # OpenMP thread, engine in-process: what a loaded machine's
                                             # other processes do not add)
          # only with speculation (counted over one pass of the prompts, the first repeat, from vLLM's
          # per-request metrics of these requests: what vllm:spec_decode_* count for this engine alone):
          "drafts": 400,                     # speculative steps (vllm:spec_decode_num_drafts)
          "draft_tokens": 1200,              # vllm:spec_decode_num_draft_tokens
          "accepted_tokens": 980,            # vllm:spec_decode_num_accepted_tokens
          "accepted_per_pos": [380, 330, 270],   # vllm:spec_decode_num_accepted_tokens_per_pos
          "acceptance_per_pos": [0.95, 0.83, 0.68],  # accepted_per_pos / drafts
          "tokens_per_step": 3.45,           # 1 + accepted_tokens / drafts (vLLM's mean acceptance length)
          "per_step_accepted": [[2, 0, 3, ...], ...],   # per prompt, its verify steps' accepted drafts in order
          "per_step_drafted": [[3, 3, 3, ...], ...],    # and their drafts (per_request_spec_decode_metrics
                                             # "detailed"; [] where vLLM gave none)
          "cells": [{"batch": 1, "temperature": 0.0, "outputs": ..., "seconds": [...] (per generate call),
                     "tokens": ..., "tokens_per_s": ..., the speculation counters above, and with the plugin
                     "plugin": {"steps", "steps_capped" (a request held more drafts than the policy chose),
                                "k_hist", "k_next_hist", "budget_violations" (verify steps where vLLM's own
                                per-request count, per_request_spec_decode_metrics "detailed", exceeds the
                                choice, or the two sequences differ), "budget_checked_steps", "per_request":
                                {"drafted": vLLM's per-step drafts per prompt, "chosen": the policy's
                                non-zero choices per prompt}, "drafter": {"skipped_steps", "plain_steps",
                                "catch_up_rows", "dropped_rows", "unheld_steps", "aux_off_steps",
                                "unpriced_steps"} (specmoe_vllm.drafter's counters, the scheduler's floor
                                steps left unpriced; in-process
                                engine only)}}, ...]
          # (the run's top-level outputs / seconds / counters are its first cell's)
        }, ...
      ]
    }

Environment: one OpenMP thread and no core binding unless the caller sets them (``OMP_NUM_THREADS``,
``VLLM_CPU_OMP_THREADS_BIND``; a 2-core shared machine); ``VLLM_CPU_KVCACHE_SPACE`` defaults to 1 GiB here.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

def _fail(msg: str) -> None:
    print(f"vllm_runner: {msg}", file=sys.stderr)
    sys.exit(2)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _spec_counters(results, n_spec: int) -> dict:
    """The speculative-decoding counters of these requests, from vLLM's per-request metrics (the histogram of
    accepted drafts per verify step, ``per_request_spec_decode_metrics``): vLLM's own counters
    (``vllm:spec_decode_num_drafts`` ...) are the same numbers summed over the *process*, which holds every
    engine when the runner interleaves them."""
    hist = [0] * (n_spec + 1)
    draft_tokens = 0
    per_acc, per_drafted = [], []
    for res in results:
        m = res.outputs[0].spec_decode_metrics if res.outputs else None
        per_acc.append([int(x) for x in getattr(m, "per_step_accepted", None) or []])
        per_drafted.append([int(x) for x in getattr(m, "per_step_drafted", None) or []])
        if m is None:
            continue
        for j, c in enumerate(m.histogram[: n_spec + 1]):
            hist[j] += int(c)
        draft_tokens += int(m.num_draft_tokens)
    drafts = sum(hist)
    per = [sum(hist[d + 1:]) for d in range(n_spec)]  # steps that accepted at least d + 1 drafts
    out = {"drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": sum(j * c for j, c in enumerate(hist)),
           "accepted_per_pos": per}
    d = max(drafts, 1)
    out["acceptance_per_pos"] = [round(a / d, 6) for a in per]
    out["tokens_per_step"] = round(1 + out["accepted_tokens"] / d, 6)
    out["per_step_accepted"], out["per_step_drafted"] = per_acc, per_drafted
    return out


def _check_draft(path: str) -> None:
    """One clear message for a draft vLLM would misread (repeated aux layer ids: an old specmoe export). A hub
    id (no such directory here) is vLLM's to resolve."""
    if not os.path.isdir(path):
        return
    try:
        with open(os.path.join(path, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        _fail(f"cannot read the EAGLE-3 draft config {path}/config.json: {exc}")
    ids = cfg.get("eagle_aux_hidden_state_layer_ids") or (cfg.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    if ids and len(set(ids)) < len(ids):
        _fail(f"EAGLE-3 draft {path}/config.json: eagle_aux_hidden_state_layer_ids {ids} repeat a layer (a "
              f"specmoe export older than the serving convention); vLLM de-duplicates them and the fc no "
              f"longer fits. Rewrite it: python -m specmoe_plugins.drafters.eagle3.checkpoint {path} NEW_DIR")


def _config(c) -> dict:
    """A config entry -> {"name", "n", "plugin"}."""
    if isinstance(c, dict):
        n = int(c.get("num_speculative_tokens", 0))
        plugin = c.get("plugin")
        if plugin is not None and (not isinstance(plugin, dict) or not plugin.get("policy")):
            _fail(f"config {c}: 'plugin' must be an object with a 'policy' file")
        if plugin is not None and n < 1:
            _fail(f"config {c}: the plugin needs num_speculative_tokens >= 1 (the most drafts a step may verify)")
        extra = c.get("speculative") or {}
        if not isinstance(extra, dict) or (extra and n < 1):
            _fail(f"config {c}: 'speculative' must be an object of more speculative_config keys (with "
                  f"num_speculative_tokens >= 1)")
        return {"name": str(c.get("name") or (f"plugin{n}" if plugin else f"eagle3_chain{n}")), "n": n,
                "plugin": plugin, "speculative": extra}
    n = int(c)
    return {"name": "no_spec" if n == 0 else f"eagle3_chain{n}", "n": n, "plugin": None, "speculative": {}}


def _check_plugin(plugin: dict) -> None:
    try:
        from specmoe_vllm.policy import PolicyFileError, load_policy
    except ImportError:
        _fail("the specmoe_vllm plugin is not installed in vLLM's environment: run bash docker/vllm_env.sh")
    try:
        load_policy(plugin["policy"])
    except PolicyFileError as exc:
        _fail(str(exc))


def _drafter_counters(llm) -> dict | None:
    """specmoe_vllm.drafter's counters of the in-process engine's proposer (None elsewhere)."""
    try:
        d = llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter
    except AttributeError:
        return None
    stats = getattr(d, "specmoe_stats", None)
    if stats is None:
        return None
    sched = getattr(getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None), "scheduler", None)
    return {**stats, "dropped_rows": d.specmoe_held.dropped,
            "unpriced_steps": getattr(sched, "specmoe_unpriced_steps", None)}


def _read_log(path: str) -> list[dict]:
    if not path or not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _budget(log: list[dict], results) -> dict:
    """The plugin's choices (its log) against what vLLM verified per request (its detailed per-request
    metrics): per request, the sequence of steps that verified drafts must be the policy's non-zero choices."""
    chosen: dict[str, list[int]] = {}
    capped = 0
    k_hist: dict[int, int] = {}
    next_hist: dict[int, int] = {}
    steps = 0
    for step in log:
        if "quiet_steps" in step:  # a run of steps that held and proposed no draft, as one line
            steps += step["quiet_steps"]
            next_hist[0] = next_hist.get(0, 0) + step["quiet_steps"]
            continue
        steps += 1
        next_hist[step["k_next"]] = next_hist.get(step["k_next"], 0) + 1
        for rid, held in step["held"].items():
            k = int(step["k"].get(rid, 0))
            k_hist[k] = k_hist.get(k, 0) + 1
            capped += k < held
            if k > 0:
                chosen.setdefault(rid.split("-")[0], []).append(k)
    violations = checked = 0
    detail = {"drafted": [], "chosen": []}
    for res in results:
        m = res.outputs[0].spec_decode_metrics
        drafted = list(m.per_step_drafted) if m is not None else []
        want = chosen.get(str(res.request_id).split("-")[0], [])
        detail["drafted"].append(drafted)
        detail["chosen"].append(want)
        checked += len(drafted)
        if len(drafted) != len(want):
            violations += max(len(drafted), len(want))
            continue
        violations += sum(d > k for d, k in zip(drafted, want))
    return {"steps": steps, "steps_capped": capped, "k_hist": {str(k): v for k, v in sorted(k_hist.items())},
            "k_next_hist": {str(k): v for k, v in sorted(next_hist.items())}, "budget_violations": violations,
            "budget_checked_steps": checked, "per_request": detail}


def _start(req: dict, config, workdir: str) -> dict:
    """One config's engine: {"cfg", "llm", "log", "startup"}."""
    from vllm import LLM

    cfg = _config(config)
    n_spec, plugin = cfg["n"], cfg["plugin"]
    cells = req.get("cells") or [{"batch": 1, "temperature": 0.0}]
    max_batch = max(int(c.get("batch", 1)) for c in cells)
    kw = dict(model=req["target"], dtype=req.get("dtype", "float32"), seed=0,
              max_model_len=int(req.get("max_model_len", 2048)), max_num_seqs=max_batch,
              enforce_eager=bool(req.get("enforce_eager", True)), disable_log_stats=False,
              skip_tokenizer_init=not os.path.isfile(os.path.join(req["target"], "tokenizer.json")))
    log_path = ""
    if n_spec > 0:
        if not req.get("draft"):
            _fail(f"config {n_spec} needs an EAGLE-3 draft: set 'draft' in the request")
        _check_draft(req["draft"])
        kw["speculative_config"] = {"method": "eagle3", "model": req["draft"],
                                    "num_speculative_tokens": int(n_spec), **cfg["speculative"]}
        kw["per_request_spec_decode_metrics"] = "detailed"
    if plugin is not None:
        _check_plugin(plugin)
        log_path = os.path.join(workdir, f"plugin_log_{cfg['name']}.jsonl")
        if os.path.exists(log_path):
            os.remove(log_path)
        opts = {k: plugin[k] for k in ("policy", "expert_cost", "online", "clock", "skip_drafter") if k in plugin}
        kw["scheduler_cls"] = "specmoe_vllm.scheduler.SpecMoEScheduler"
        kw["additional_config"] = {"specmoe": {**opts, "log": log_path}}
    kw.update(req.get("engine_args") or {})
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if req.get("multiprocessing", False) else "0"
    t0 = time.perf_counter()
    llm = LLM(**kw)
    return {"cfg": cfg, "llm": llm, "log": log_path, "startup": time.perf_counter() - t0}


def _measure_cell(req: dict, engines: list[dict], cell: dict) -> list[dict]:
    """One cell on every engine: per prompt group, each engine in turn (the order rotated group by group and
    repeat by repeat, so a drift of the machine's speed hits every engine alike); per engine the cell's entry."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in req["prompts"]]
    repeats = max(1, int(req.get("repeats", 1)))
    batch, temp = int(cell.get("batch", 1)), float(cell.get("temperature", 0.0))

    def params(i: int):
        return SamplingParams(temperature=temp, max_tokens=int(req["max_new_tokens"]),
                              ignore_eos=bool(req.get("ignore_eos", True)), detokenize=False,
                              seed=(1000 + i) if temp > 0 else None)

    groups = [list(range(i, min(i + batch, len(prompts)))) for i in range(0, len(prompts), batch)]
    for e in engines:
        for g in groups[: int(req.get("warmup", 1))]:
            e["llm"].generate([prompts[i] for i in g], [params(i) for i in g], use_tqdm=False)
    # the warm heap out of the collector's scans, as vLLM's engine does with its start-up heap (freeze_gc_heap):
    # otherwise a full collection walks every engine's objects, and it comes more often to the configuration
    # that allocates more per step (the plugin's scheduler: 0.93x against 1.00x of no speculation with it, at
    # batch 1, T = 1, eight engines in one process, a Zen 4)
    gc.collect()
    gc.freeze()
    st = [{"outputs": [None] * len(prompts), "seconds": [], "cpu": [], "spec": None, "results": [],
           "log_start": len(_read_log(e["log"])), "log": [],
           "drafter": _drafter_counters(e["llm"]) if e["cfg"]["plugin"] is not None else None} for e in engines]
    for r in range(repeats):
        for j, g in enumerate(groups):
            shift = (j + r) % len(engines)
            for k in list(range(len(engines)))[shift:] + list(range(len(engines)))[:shift]:
                s = st[k]
                t, tc = time.perf_counter(), time.process_time()
                res = engines[k]["llm"].generate([prompts[i] for i in g], [params(i) for i in g], use_tqdm=False)
                dt, dc = time.perf_counter() - t, time.process_time() - tc
                if r == 0:
                    s["results"].extend(res)
                    for i, o in zip(g, res):
                        s["outputs"][i] = [int(x) for x in o.outputs[0].token_ids]
                    s["seconds"].append(dt)
                    s["cpu"].append(dc)
                else:
                    s["seconds"][j] = min(s["seconds"][j], dt)
                    s["cpu"][j] = min(s["cpu"][j], dc)
        for e, s in zip(engines, st):
            if r == 0 and e["cfg"]["n"] > 0:
                s["spec"] = _spec_counters(s["results"], e["cfg"]["n"])
            if r == 0 and e["cfg"]["plugin"] is not None:
                s["log"] = _read_log(e["log"])[s["log_start"]:]
    done = []
    for e, s in zip(engines, st):
        tokens = sum(len(o) for o in s["outputs"])
        out = {"batch": batch, "temperature": temp, "outputs": s["outputs"],
               "seconds": [round(x, 6) for x in s["seconds"]], "cpu_seconds": [round(x, 6) for x in s["cpu"]],
               "tokens": tokens, "tokens_per_s": round(tokens / max(sum(s["seconds"]), 1e-9), 3),
               "tokens_per_cpu_s": round(tokens / max(sum(s["cpu"]), 1e-9), 3)}
        if s["spec"] is not None:
            out.update(s["spec"])
        if e["cfg"]["plugin"] is not None:
            out["plugin"] = _budget(s["log"], s["results"])
            counters = _drafter_counters(e["llm"])
            if counters is not None and s["drafter"] is not None:
                out["plugin"]["drafter"] = {k: v - s["drafter"].get(k, 0) for k, v in counters.items()}
        done.append(out)
    return done


def _run_entry(e: dict, cells: list[dict]) -> dict:
    cfg = e["cfg"]
    return {"name": cfg["name"], "num_speculative_tokens": int(cfg["n"]), "startup_s": round(e["startup"], 3),
            **{k: v for k, v in cells[0].items() if k not in ("batch", "temperature")}, "cells": cells}


def run_configs(req: dict, workdir: str = ".", on_run=None) -> list[dict]:
    """Every config of the request on every cell: one engine at a time (``on_run`` gets each run as it ends), or,
    with ``"interleave": true``, every engine started first and the configs measured in turn prompt group by prompt
    group (one process, engine in-process: the ratios between configs are paired in time)."""
    cells = req.get("cells") or [{"batch": 1, "temperature": 0.0}]
    configs = req.get("configs", [0])
    if not req.get("interleave"):
        runs = []
        for c in configs:
            e = _start(req, c, workdir)
            runs.append(_run_entry(e, [_measure_cell(req, [e], cell)[0] for cell in cells]))
            del e
            gc.unfreeze()  # the engine's frozen objects collectable again (its KV cache) before the next one
            gc.collect()
            if on_run is not None:
                on_run(runs)
        return runs
    if req.get("multiprocessing", False):
        _fail("'interleave' runs every engine in this process: leave 'multiprocessing' false")
    engines = [_start(req, c, workdir) for c in configs]
    per_cell = [_measure_cell(req, engines, cell) for cell in cells]
    runs = [_run_entry(e, [pc[k] for pc in per_cell]) for k, e in enumerate(engines)]
    if on_run is not None:
        on_run(runs)
    return runs


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        _fail("usage: vllm_runner.py REQUEST.json OUT.json")
    try:
        with open(argv[1]) as f:
            req = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        _fail(f"cannot read the request {argv[1]}: {exc}")
    missing = [k for k in ("target", "prompts", "max_new_tokens") if k not in req]
    if missing:
        _fail(f"request {argv[1]} lacks {', '.join(missing)}")
    import torch
    import vllm

    out = {"engine": "vllm", "vllm_version": vllm.__version__, "torch_version": torch.__version__,
           "dtype": req.get("dtype", "float32"), "threads": int(os.environ["OMP_NUM_THREADS"]),
           "cpu": _cpu_name(), "max_new_tokens": int(req["max_new_tokens"]), "runs": []}
    workdir = os.path.dirname(os.path.abspath(argv[2]))

    def write(runs: list[dict]) -> None:  # partial results survive a later config's failure
        out["runs"] = list(runs)
        with open(argv[2], "w") as f:
            json.dump(out, f, indent=1)

    run_configs(req, workdir, write)


if __name__ == "__main__":
    main(sys.argv)
