# SPDX-License-Identifier: Apache-2.0
"""``vllm_peer``: vLLM's own speculative decoding on the recipe's target, measured in vLLM's environment.

One stage of a recipe (registered through the entry-point group ``specmoe.stages``): vLLM (``vllm_python``, an
environment made by ``docker/vllm_env.sh`` or a CUDA build of vLLM with ``plugins/specmoe_vllm`` installed) runs the
dataset's prompts through ``vllm_runner.py`` (this folder) per cell (batch x temperature), in three passes:

1. fixed draft counts: no speculation and EAGLE-3 chains of 1..``max_drafts``;
2. the specmoe_vllm plugin (``SpecMoEScheduler``) per variant (``plugin``: expert-aware; ``plugin_tokens``: the
   token-only ablation), its policy exported from ``token_table`` (a ``build_token_table`` stage) and
   ``cost_model`` with the step cost refitted on pass 1 (``platform peer export-policy``);
3. vLLM's adaptive verification (``enable_adaptive_verification`` on its V2 model runner) with ``max_drafts``,
   where this vLLM has it: a configuration vLLM refuses is recorded with vLLM's message, not fatal.

Writes ``fixed.json``, ``plugin.json``, ``adaptive.json`` (the runner's outputs), ``policy.json`` and
``summary.json``: per cell tokens/s of every configuration, the best fixed one, each plugin variant's ratio to it
and its budget check, and the greedy agreement with no speculation. A measurement of the machine: the GPUs and the
vLLM build are part of the cache key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from specmoe.config.schema import Component, component
from specmoe.errors import UserError
from specmoe.interfaces.stage import Stage, StageContext

__all__ = ["VllmPeer", "summarise"]

RUNNER = Path(__file__).with_name("vllm_runner.py")


class VllmPeer(Stage):
    """vLLM: fixed draft counts, the specmoe_vllm plugin and adaptive verification, per batch x temperature."""

    description = "vLLM on the target: no speculation, EAGLE-3 chains 1..n, the specmoe_vllm plugin, adaptive"
    version = "1"

    @dataclass
    class Config:
        dataset: Component = component("dataset")
        """the prompts, e.g. ``{name: gsm8k, limit: 64}`` (rendered with the target's tokenizer)."""
        target: str = ""
        """the target as vLLM loads it (hub id or checkpoint directory)."""
        draft: str = ""
        """the EAGLE-3 draft (vLLM's convention: distinct aux layer ids)."""
        vllm_python: str = ""
        """vLLM's python; default ``$SPECMOE_VLLM_PYTHON``."""
        max_drafts: int = 5
        batches: list[int] = field(default_factory=lambda: [1, 4, 8])
        temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
        new_tokens: int = 256
        dtype: str = "bfloat16"
        token_table: Optional[str] = None
        """a ``build_token_table`` stage (``stage:<id>``): the plugin's token-to-experts table."""
        cost_model: Optional[str] = None
        """specmoe's ``cost_model.json`` (optional): the prior of the plugin's step cost."""
        variants: list[str] = field(default_factory=lambda: ["plugin", "plugin_tokens"])
        """plugin rows: ``plugin`` (expert-aware), ``plugin_tokens`` (token-only); empty: no plugin pass."""
        skip_drafter: bool = True
        """the plugin's plain steps (no drafter pass where a step proposes nothing; specmoe_vllm.drafter)."""
        adaptive: bool = True
        """also run vLLM's adaptive verification (V2 model runner)."""
        engine_args: dict[str, Any] = field(default_factory=dict)
        """more ``vllm.LLM`` arguments, e.g. ``{tensor_parallel_size: 8, gpu_memory_utilization: 0.9}``."""
        repeats: int = 1
        warmup: int = 1
        max_model_len: int = 4096

    @classmethod
    def key_facts(cls, options: dict[str, Any]) -> dict[str, Any]:
        from specmoe.tracking.environment import hardware

        hw = hardware()
        return {"cpu": hw.get("env.hw.cpu"), "gpus": hw.get("env.hw.gpus"),
                "vllm_python": options.get("vllm_python") or os.environ.get("SPECMOE_VLLM_PYTHON", "")}

    def _check(self) -> str:
        cfg = self.config
        py = cfg.vllm_python or os.environ.get("SPECMOE_VLLM_PYTHON", "")
        if not py or not Path(py).is_file():
            raise UserError(f"vllm_peer.vllm_python: vLLM's python {py or '(unset)'} not found: set it or "
                            f"$SPECMOE_VLLM_PYTHON (bash docker/vllm_env.sh makes a CPU one; on GPUs a CUDA vLLM "
                            f"with pip install -e plugins/specmoe_vllm)")
        for key in ("target", "draft"):
            if not getattr(cfg, key):
                raise UserError(f"vllm_peer.{key} is empty: give the {key} checkpoint vLLM loads")
        bad = [v for v in cfg.variants if v not in ("plugin", "plugin_tokens")]
        if bad:
            raise UserError(f"vllm_peer.variants: unknown {bad[0]!r} (plugin, plugin_tokens)")
        if cfg.variants and not cfg.token_table:
            raise UserError("vllm_peer.token_table: the plugin needs a token table (stage:<build_token_table id>), "
                            "or set variants: [] to measure vLLM's own configurations only")
        if cfg.max_drafts < 1 or not cfg.batches or min(cfg.batches) < 1 or cfg.new_tokens < 1:
            raise UserError("vllm_peer: max_drafts, batches and new_tokens must be >= 1")
        return py

    def _prompts(self, ctx: StageContext) -> list[list[int]]:
        from transformers import AutoTokenizer

        from specmoe.data import render_prompt
        from specmoe.data.samples import load_samples

        tok = AutoTokenizer.from_pretrained(self.config.target)
        return [render_prompt(tok, s) for s in load_samples([self.config.dataset], "vllm_peer.dataset",
                                                             ctx.data_dir)]

    def _vllm(self, py: str, out_dir: Path, tag: str, configs: list[Any], prompts: list[list[int]],
              env: dict[str, str] | None = None, fatal: bool = True) -> dict[str, Any]:
        cfg = self.config
        req = {"target": cfg.target, "draft": cfg.draft, "prompts": prompts, "max_new_tokens": cfg.new_tokens,
               "configs": configs, "dtype": cfg.dtype, "repeats": cfg.repeats, "warmup": cfg.warmup,
               "cells": [{"batch": b, "temperature": t} for t in cfg.temperatures for b in cfg.batches],
               "max_model_len": cfg.max_model_len, "engine_args": dict(cfg.engine_args), "ignore_eos": True}
        (out_dir / f"{tag}_request.json").write_text(json.dumps(req))
        run_env = {**os.environ, **(env or {})}
        run_env.pop("PYTHONPATH", None)  # vLLM's environment: nothing of specmoe's on its path
        proc = subprocess.run([py, str(RUNNER), str(out_dir / f"{tag}_request.json"), str(out_dir / f"{tag}.json")],
                              env=run_env, capture_output=True, text=True, cwd=str(out_dir))
        (out_dir / f"{tag}.log").write_text(proc.stderr[-200000:])
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines() or ["(no output)"]
            if fatal:
                tail = "\n".join(lines[-12:])
                raise UserError(f"vllm_peer: vLLM ({py}) failed on the {tag} pass (exit {proc.returncode}):\n{tail}")
            # vLLM's reason (its last error line and the one after it); the whole log is {tag}.log
            at = next((i for i in range(len(lines) - 1, -1, -1) if "Error" in lines[i]), len(lines) - 1)
            return {"error": " ".join(ln.strip() for ln in lines[at:at + 2]), "runs": []}
        return json.loads((out_dir / f"{tag}.json").read_text())

    def run(self, out_dir: Path, ctx: StageContext) -> dict[str, Any]:
        from specmoe_plugins.peers.vllm import export

        cfg = self.config
        py = self._check()
        prompts = self._prompts(ctx)
        passes = {"fixed": self._vllm(py, out_dir, "fixed", list(range(cfg.max_drafts + 1)), prompts)}
        if cfg.variants:
            pol = export.build_policy(token_table=cfg.token_table, cost_model=cfg.cost_model,
                                      vllm_run=str(out_dir / "fixed.json"), acceptance=None,
                                      max_drafts=cfg.max_drafts)
            (out_dir / "policy.json").write_text(json.dumps(pol))
            plugin = {"policy": str(out_dir / "policy.json"), "skip_drafter": cfg.skip_drafter}
            configs = [{"name": v, "num_speculative_tokens": cfg.max_drafts,
                        "plugin": {**plugin, "expert_cost": v == "plugin"}} for v in cfg.variants]
            passes["plugin"] = self._vllm(py, out_dir, "plugin", configs, prompts)
        if cfg.adaptive:
            configs = [{"name": "adaptive", "num_speculative_tokens": cfg.max_drafts,
                        "speculative": {"enable_adaptive_verification": True}}]
            passes["adaptive"] = self._vllm(py, out_dir, "adaptive", configs, prompts,
                                            env={"VLLM_USE_V2_MODEL_RUNNER": "1"}, fatal=False)
        summary = summarise(passes)
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary["cells"], indent=1), file=sys.stderr)
        return summary


def summarise(passes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per cell: tokens/s of every configuration, the best fixed one, the plugin's ratios and budget checks,
    greedy agreement with no speculation; the adaptive pass's error where vLLM refused it."""
    cells: dict[str, dict[str, Any]] = {}
    for kind, out in passes.items():
        for run in out.get("runs", []):
            for c in run.get("cells") or []:
                key = f"b{c['batch']}_T{c['temperature']:g}"
                cell = cells.setdefault(key, {"batch": c["batch"], "temperature": c["temperature"], "rows": {},
                                              "_outputs": {}})
                row = {"kind": kind, "tok_s": c["tokens_per_s"], "tokens_per_step": c.get("tokens_per_step", 1.0)}
                if "plugin" in c:
                    row["budget_violations"] = c["plugin"]["budget_violations"]
                cell["rows"][run["name"]] = row
                cell["_outputs"][run["name"]] = c["outputs"]
    for cell in cells.values():
        outs = cell.pop("_outputs")
        fixed = {n: r["tok_s"] for n, r in cell["rows"].items() if r["kind"] == "fixed"}
        if fixed:
            best = max(fixed, key=fixed.get)
            cell["best_fixed"] = best
            for r in cell["rows"].values():
                r["vs_best_fixed"] = r["tok_s"] / fixed[best] if fixed[best] else None
        ref = outs.get("no_spec")
        if cell["temperature"] == 0 and ref is not None:
            for n, r in cell["rows"].items():
                r["agreement"] = sum(a == b for a, b in zip(outs[n], ref)) / max(len(ref), 1)
    errors = {k: v["error"] for k, v in passes.items() if v.get("error")}
    return {"cells": cells, "errors": errors}
