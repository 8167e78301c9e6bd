# SPDX-License-Identifier: Apache-2.0
"""The evaluation grid of a recipe: methods x datasets x temperatures x budgets x batch sizes.

One group (:mod:`specmoe.evaluation.group`) per (dataset, temperature, batch size), locked while measured and
cached under a hash of everything that determines its numbers, the measuring code included.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from specmoe.config.schema import Component, MethodConfig, RunConfig
from specmoe.decoding.settings import DecodeSettings
from specmoe.decoding.stopping import StopRule
from specmoe.errors import UserError
from specmoe.evaluation.group import EvalGroup, Member
from specmoe.evaluation.method import Method
from specmoe.evaluation.results import CellResult
from specmoe.utils.files import FileLock
from specmoe.utils.hashing import stable_hash

if TYPE_CHECKING:
    from tqdm import tqdm

    from specmoe.interfaces.target import Target

__all__ = ["Evaluator", "AR_METHOD"]

logger = logging.getLogger(__name__)

#: the implicit autoregressive baseline, added when a recipe lists no drafter-less method
AR_METHOD = "ar"


class Evaluator:
    """Runs the grid.

    Args:
        resolve / resolve_key: ``stage:<id>`` -> output directory / stage cache key (for group keys).
        samples: dataset name -> loaded samples.
        code: the code version (:func:`specmoe.tracking.environment.code_version`) measuring the groups.
        on_group: called with the cells of every finished group (MLflow logging).
    """

    def __init__(self, cfg: RunConfig, target: Target, resolve: Callable[[Any], Any], resolve_key: Callable[[Any], Any],
                 samples: dict[str, list], render: Callable, decode: Callable, cache_dir: Path,
                 code: dict[str, Any] | None = None,
                 on_group: Callable[[list[CellResult]], None] | None = None) -> None:
        self.cfg = cfg
        self.target = target
        self.resolve = resolve
        self.resolve_key = resolve_key
        self.samples = samples
        self.render = render
        self.decode = decode
        self.cache = Path(cache_dir) / "eval"
        self.code = code or {}
        self.on_group = on_group
        self._methods: dict[str, Method] = {}
        methods = list(cfg.methods)
        if not any(m.drafter is None for m in methods):
            methods.insert(0, MethodConfig(name=AR_METHOD))
        self.ar_cfg = next(m for m in methods if m.drafter is None)
        self.spec_cfgs = [m for m in methods if m.drafter is not None]
        self.margin, self.max_prompts = cfg.eval.prompts_for_margin, cfg.eval.max_prompts
        if self.margin is not None and not 0 < self.margin < 1:
            raise UserError(f"eval.prompts_for_margin: {self.margin} is not a relative margin in (0, 1); "
                            f"e.g. 0.02 for ±2 %, or null to measure the listed prompts only")
        if self.margin is not None and self.max_prompts < 1:
            raise UserError(f"eval.max_prompts: {self.max_prompts}; the cap of eval.prompts_for_margin must be "
                            f">= 1 prompt")

    def _sig(self, comp: Component | None) -> dict[str, Any] | None:
        return None if comp is None else {"name": comp.name, "options": self.resolve_key(comp.options)}

    def _method_sig(self, m: MethodConfig, budget: int) -> dict[str, Any]:
        parts = ("drafter", "selector", "predictor", "verifier") if m.drafter is not None else ("verifier",)
        return {"name": m.name, "budget": budget, "analysis_only": m.analysis_only,
                **{k: self._sig(getattr(m, k)) for k in parts}}

    def budgets(self) -> list[int]:
        return list(self.cfg.eval.budgets or [self.cfg.decoding.budget])

    def method_budgets(self, m: MethodConfig) -> list[int]:
        """The γ values ``m`` runs at: its own ``budgets``, else the grid's."""
        return list(m.budgets or self.budgets())

    def _spec_members(self) -> list[tuple[int, MethodConfig]]:
        """(γ, method) pairs by γ (the grid's first, then methods' own), then method order."""
        all_g = list(dict.fromkeys(self.budgets() + [g for m in self.spec_cfgs for g in self.method_budgets(m)]))
        return [(g, m) for g in all_g for m in self.spec_cfgs if g in self.method_budgets(m)]

    def group_key(self, ds: Component, temperature: float, bsz: int) -> str:
        d = self.cfg.decoding
        members = [self._method_sig(self.ar_cfg, 1)] + [self._method_sig(m, g) for g, m in self._spec_members()]
        return stable_hash({
            "target": self._sig(self.cfg.target), "dataset": self._sig(ds),
            "decoding": {"steps": d.steps, "top_k": d.top_k, "max_new_tokens": d.max_new_tokens,
                         "stop_strings": d.stop_strings, "ignore_eos": d.ignore_eos},
            "temperature": temperature, "batch_size": bsz, "seed": self.cfg.eval.seed,
            "warmup": self.cfg.eval.warmup, "members": members, "code": self.code, "v": 3,
            **({"repeats": self.cfg.eval.repeats} if self.cfg.eval.repeats != 1 else {}),
            **({"prompts_for_margin": self.margin, "max_prompts": self.max_prompts} if self.margin else {})})

    def method(self, m: MethodConfig) -> Method:
        if m.name not in self._methods:
            self._methods[m.name] = Method(m, self.target, self.resolve)
        return self._methods[m.name]

    def _members(self) -> list[Member]:
        ar = Member(self.ar_cfg.name, 1, lambda: self.method(self.ar_cfg), autoregressive=True)
        out = [ar]
        for g, m in self._spec_members():
            out.append(Member(m.name, g, lambda m=m: self.method(m), analysis_only=self._analysis_only(m),
                              adaptive=self._adaptive(m)))
        return out

    @staticmethod
    def _adaptive(m: MethodConfig) -> bool:
        from specmoe.interfaces.selection import AdaptiveSelector

        return issubclass(m.selector.plugin_class(), AdaptiveSelector)

    def _analysis_only(self, m: MethodConfig) -> bool:
        if m.analysis_only:
            return True
        if m.predictor is None:
            return False
        return bool(getattr(m.predictor.plugin_class(), "analysis_only", False))

    def _stop(self) -> StopRule:
        d = self.cfg.decoding
        ids = [] if d.ignore_eos else self.target.eos_token_ids
        tok = self.target.tokenizer if d.stop_strings else None
        return StopRule(d.max_new_tokens, stop_ids=ids, stop_strings=d.stop_strings, tokenizer=tok)

    def groups(self, progress: tqdm | None = None) -> list[EvalGroup]:
        cfg, d = self.cfg, self.cfg.decoding
        members = self._members()
        facts = {"bytes_per_expert": int(self.target.bytes_per_expert_stored),
                 "bytes_per_expert_loaded": int(self.target.bytes_per_expert),
                 "num_moe_layers": int(self.target.num_moe_layers)}
        decoding = DecodeSettings(budget=d.budget, steps=d.steps, top_k=d.top_k, temperature=0.0, stop=self._stop(),
                                  seed=cfg.eval.seed)
        out = []
        for temperature in cfg.eval.temperatures:
            for bsz in cfg.eval.batch_sizes:
                for ds in cfg.datasets:
                    out.append(EvalGroup(self.cache / self.group_key(ds, temperature, bsz), members,
                                         self.samples[ds.name], dataset=ds.name, temperature=temperature,
                                         batch_size=bsz, render=self.render, decode=self.decode,
                                         decoding=decoding, warmup=cfg.eval.warmup, seed=cfg.eval.seed,
                                         target_facts=facts, progress=progress, repeats=cfg.eval.repeats,
                                         margin=self.margin, max_prompts=self.max_prompts,
                                         more=lambda ds=ds: self.more_samples(ds)))
        return out

    def more_samples(self, ds: Component) -> list[Any]:
        """``ds``'s seeded subset at ``eval.max_prompts``, in order: what ``eval.prompts_for_margin`` may add."""
        return ds.build(limit=self.max_prompts).load()

    def run(self) -> list[CellResult]:
        """Every group, in grid order; each group's cells AR first, then by γ and method."""
        from tqdm.auto import tqdm

        groups = self.groups()
        total = sum(g.generations() for g in groups)
        cells: list[CellResult] = []
        with tqdm(total=total, desc="evaluation", unit="generation") as bar:
            for g in groups:
                g.progress = bar
                bar.set_postfix_str(f"{g.dataset} T={g.temperature} bs={g.batch_size}")
                with FileLock(g.dir.with_name(g.dir.name + ".lock"),
                              f"evaluation group {g.dataset} T={g.temperature} bs={g.batch_size}"):
                    got = g.run()
                for c in got:
                    c.order = len(cells)
                    cells.append(c)
                if self.on_group is not None:
                    self.on_group(got)
        return cells
