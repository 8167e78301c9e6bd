# SPDX-License-Identifier: Apache-2.0
"""The evaluation grid of a recipe, cached per cell and logged as nested MLflow runs.

Every (method, dataset, temperature, gamma, batch size) cell is stored in ``<cache_dir>/eval/<key>.json``
keyed by a hash of everything that determines it (components with stage references replaced by stage keys,
dataset options, decoding settings, seed), so a rerun never recomputes a finished cell and a killed run
continues where it stopped. Speedups are relative to the autoregressive cell of the same dataset, temperature
and batch size (Spec-Bench: ratio of mean per-question tokens/s).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

from specmoe.config.schema import Component, MethodConfig, RunConfig
from specmoe.decoding.stopping import StopRule
from specmoe.evaluation.cell import CellSpec, run_cell
from specmoe.evaluation.method import Method

__all__ = ["Evaluator", "AR_METHOD"]

logger = logging.getLogger(__name__)

#: the implicit autoregressive baseline, added when a recipe lists no drafter-less method
AR_METHOD = "ar"


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _atomic_write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


class Evaluator:
    """Runs the grid.

    Args:
        cfg: the resolved recipe.
        target: the loaded target.
        resolve: ``stage:<id>`` -> output directory (for building components).
        resolve_key: ``stage:<id>`` -> stage cache key (for cell keys).
        samples: dataset name -> loaded samples (loaded once, before any work).
        render / decode: prompt rendering and detokenization for this target.
        cache_dir: where cells are cached.
        tracker / parent: MLflow tracker and parent run handle (``None`` without tracking).
    """

    def __init__(self, cfg: RunConfig, target: Any, resolve: Callable[[Any], Any], resolve_key: Callable[[Any], Any],
                 samples: dict[str, list], render: Callable, decode: Callable, cache_dir: Path,
                 tracker: Any = None, parent: Any = None) -> None:
        self.cfg = cfg
        self.target = target
        self.resolve = resolve
        self.resolve_key = resolve_key
        self.samples = samples
        self.render = render
        self.decode = decode
        self.cache = Path(cache_dir) / "eval"
        self.cache.mkdir(parents=True, exist_ok=True)
        self.tracker = tracker
        self.parent = parent
        self._methods: dict[str, Method] = {}
        methods = list(cfg.methods)
        if not any(m.drafter is None for m in methods):
            methods.insert(0, MethodConfig(name=AR_METHOD))
        self.method_cfgs = methods
        self.ar_cfg = next(m for m in methods if m.drafter is None)

    # ------------------------------------------------------------------ keys and cells
    def _sig(self, comp: Component | None) -> Any:
        return None if comp is None else {"name": comp.name, "options": self.resolve_key(comp.options)}

    def cell_key(self, m: MethodConfig, ds: Component, temperature: float, budget: int, bsz: int) -> str:
        d = self.cfg.decoding
        return _hash({
            "target": self._sig(self.cfg.target), "dataset": self._sig(ds),
            "method": {k: self._sig(getattr(m, k)) for k in ("drafter", "selector", "predictor", "verifier")}
            if m.drafter is not None else {"verifier": self._sig(m.verifier)},
            "decoding": {"steps": d.steps, "top_k": d.top_k, "max_new_tokens": d.max_new_tokens,
                         "stop_strings": d.stop_strings, "ignore_eos": d.ignore_eos},
            "temperature": temperature, "budget": budget if m.drafter is not None else 0, "batch_size": bsz,
            "seed": self.cfg.eval.seed, "warmup": self.cfg.eval.warmup, "v": 1})

    def method(self, m: MethodConfig) -> Method:
        if m.name not in self._methods:
            self._methods[m.name] = Method(m, self.target, self.resolve)
        return self._methods[m.name]

    def _stop(self) -> StopRule:
        d = self.cfg.decoding
        ids = [] if d.ignore_eos else self.target.eos_token_ids
        tok = self.target.tokenizer if d.stop_strings else None
        return StopRule(d.max_new_tokens, stop_ids=ids, stop_strings=d.stop_strings, tokenizer=tok)

    def _cell(self, m: MethodConfig, ds: Component, temperature: float, budget: int, bsz: int,
              progress: Any) -> dict[str, Any]:
        key = self.cell_key(m, ds, temperature, budget, bsz)
        path = self.cache / f"{key}.json"
        spec = CellSpec(m.name, ds.name, temperature, budget if m.drafter is not None else 1, bsz)
        if path.is_file():
            result = json.loads(path.read_text())
            result["cached"] = True
            if progress is not None:
                progress.update(len(self.samples[ds.name]))
            return result
        d = self.cfg.decoding
        result = run_cell(self.method(m), self.samples[ds.name], self.render, self.decode, spec, steps=d.steps,
                          top_k=d.top_k, stop=self._stop(), warmup=self.cfg.eval.warmup, seed=self.cfg.eval.seed,
                          progress=progress)
        result["key"] = key
        _atomic_write(path, result)
        result["cached"] = False
        return result

    # ------------------------------------------------------------------ grid
    def run(self) -> list[dict[str, Any]]:
        from tqdm.auto import tqdm

        cfg = self.cfg
        budgets = cfg.eval.budgets or [cfg.decoding.budget]
        spec_methods = [m for m in self.method_cfgs if m.drafter is not None]
        n_cells = len(cfg.eval.temperatures) * len(cfg.eval.batch_sizes) * len(cfg.datasets) * (
            1 + len(budgets) * len(spec_methods))
        total = sum(len(self.samples[ds.name]) for ds in cfg.datasets) * n_cells // max(len(cfg.datasets), 1)
        cells: list[dict[str, Any]] = []
        with tqdm(total=total, desc="evaluation", unit="sample") as bar:
            for temperature in cfg.eval.temperatures:
                for bsz in cfg.eval.batch_sizes:
                    for ds in cfg.datasets:
                        bar.set_postfix_str(f"{self.ar_cfg.name} {ds.name} T={temperature} bs={bsz}")
                        ar = self._cell(self.ar_cfg, ds, temperature, 1, bsz, bar)
                        self._derive(ar, ar)
                        self._log(ar)
                        cells.append(ar)
                        for budget in budgets:
                            for m in spec_methods:
                                bar.set_postfix_str(f"{m.name} {ds.name} T={temperature} g={budget} bs={bsz}")
                                cell = self._cell(m, ds, temperature, budget, bsz, bar)
                                self._derive(cell, ar)
                                self._log(cell)
                                cells.append(cell)
        return cells

    @staticmethod
    def _derive(cell: dict[str, Any], ar: dict[str, Any]) -> None:
        """speedup vs AR, rho = T_AR (per token) / T_verify, and equality with AR outputs at T = 0."""
        m, a = cell["metrics"], ar["metrics"]
        m["speedup"] = m["tokens_per_s"] / a["tokens_per_s"] if a["tokens_per_s"] > 0 else 0.0
        m["rho"] = a["t_total"] / m["t_verify"] if m.get("t_verify") else 0.0
        if cell["spec"]["temperature"] == 0:
            same = [o["tokens"] == r["tokens"] for o, r in zip(cell["outputs"], ar["outputs"])]
            m["matches_ar"] = sum(same) / max(len(same), 1)

    def _log(self, cell: dict[str, Any]) -> None:
        if self.tracker is None or self.parent is None:
            return
        from specmoe.evaluation.report import log_cell

        log_cell(self.tracker, self.parent, cell, self.decode)
