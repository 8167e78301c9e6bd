# SPDX-License-Identifier: Apache-2.0
"""Aliases of moved modules: every name taken from the old place is the new place's object, with a warning.

:data:`MOVED` lists every deprecated module path of the core whose *names* moved; :data:`MOVED_MODULES` those
whose old path gives the new module *itself* (the draft-model internals of ``specmoe.drafting``, a package kept only
as an alias, :data:`MOVED_PACKAGES`); no file stands for any of them. :func:`install_aliases` (run once by
``specmoe/__init__.py``) puts a finder on :data:`sys.meta_path` that makes ``import <old>``, ``from <package> import
<old>`` and ``importlib.util.find_spec(<old>)`` find them. A new module stays a name until it is first used: the
core imports no plugin.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any, Callable, Sequence

__all__ = ["moved_names", "REMOVED_IN", "MOVED", "MOVED_MODULES", "MOVED_PACKAGES", "install_aliases"]

#: the release that drops the aliases (they are kept for one minor version)
REMOVED_IN = "0.3.0"


def moved_names(old: str, new: ModuleType | str, names: list[str], use: str | None = "specmoe.plugin_api"
                ) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """``(__getattr__, __dir__)`` for a deprecated module ``old`` whose ``names`` now live in ``new``.

    Taking a name gives ``getattr(new, name)`` and emits a :class:`DeprecationWarning` naming the new place and
    where to import it from (``use``: the stable plugin API by default; ``None``: the new module); any other name
    is an :class:`AttributeError` that says where to look. ``new`` given by name is imported when a name is
    first taken: that is how a core module that moved into a built-in plugin's folder keeps its old path
    without the core importing the plugins.
    """
    new_name = new if isinstance(new, str) else new.__name__
    use = use or new_name

    def getattr_(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r} (it is a deprecated alias of "
                                 f"{new_name!r}; import from {use!r})")
        warnings.warn(f"'{old}.{name}' moved to '{new_name}.{name}': import it from '{use}'"
                      f"{' (the stable plugin API)' if use == 'specmoe.plugin_api' else ''}; the alias '{old}' will "
                      f"be removed in specmoe {REMOVED_IN}",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new) if isinstance(new, str) else new, name)

    return getattr_, lambda: sorted(names)


_API = "specmoe.plugin_api"
_GOODPUT = "specmoe_plugins.selectors.goodput"
_UNION = "specmoe_plugins.verifiers.union"
_TINY = "specmoe_plugins.targets.tiny"
_HF = "specmoe_plugins.targets.hf"
_VLLM = "specmoe_plugins.peers.vllm"
_BENCHES = "specmoe_plugins.benches"

#: old module -> (new module, the names it keeps, where to import them from: ``None`` is the new module,
#: :func:`moved_names`). Names ``None``: the new module's ``__all__`` (read when the alias is imported; core only).
MOVED: dict[str, tuple[str, list[str] | None, str | None]] = {
    # interfaces made a leaf package
    "specmoe.decoding.kv": ("specmoe.interfaces.kv", ["KVState", "additive_mask"], _API),
    "specmoe.decoding.tree": ("specmoe.interfaces.tree",
                              ["DraftTree", "ancestor_matrix", "is_ancestor_closed", "close_under_ancestors"], _API),
    # tables and figures moved to the evaluation side (tracking/ is the MLflow adapter only)
    "specmoe.tracking.compare": ("specmoe.evaluation.report_tables", None, None),
    "specmoe.tracking.plots": ("specmoe.evaluation.report_plots", None, None),
    # the evaluation of predictors on traces beside the routing metrics it uses (no traces <-> training loop)
    "specmoe.traces.evaluate": ("specmoe.training.trace_eval", None, None),
    # core modules moved into a built-in plugin's folder (issue 24.1)
    "specmoe.bench.cost_calibration": (f"{_GOODPUT}.calibration",
                                       ["grid", "calibrate", "shape_of", "fit_split", "engine_check"], None),
    "specmoe.bench.expert_latency": (f"{_GOODPUT}.expert_latency",
                                     ["add_arguments", "run", "forced_routing", "override_routers", "fit_line",
                                      "measure"], None),
    "specmoe.decoding.cost_model": (f"{_GOODPUT}.cost_model",
                                    ["FEATURES", "DEFAULT_FEATURES", "VerifyShape", "CostModel", "huber_fit",
                                     "relative_errors"], None),
    "specmoe.bench.verifier": (f"{_UNION}.bench",
                               ["add_arguments", "run", "LayerSpec", "MODELS", "TINY_MODELS", "build_experts",
                                "union_routing", "sweep"], None),
    "specmoe.kernels.layout": (f"{_UNION}.layout",
                               ["ExpertsLayout", "experts_layout", "expert_forward", "apply_gate", "ACT_SILU",
                                "ACT_SWIGLU_OAI"], None),
    "specmoe.kernels.routing_meta": (f"{_UNION}.routing_meta", ["RoutingMeta", "routing_meta"], None),
    "specmoe.kernels.union_moe": (f"{_UNION}.kernels", ["UnionBlocks", "union_moe", "is_interpreted"], None),
    "specmoe.kernels.union_torch": (f"{_UNION}.reference",
                                    ["union_experts_forward", "grouped_supported", "prepare", "packed_experts",
                                     "PACK_MAX_BYTES", "graph_experts"], None),
    "specmoe.bench.predictor": ("specmoe_plugins.predictors.draft_head.bench",
                                ["add_arguments", "run", "GPTOSS120B", "head_case", "demo_target", "learned_case"],
                                None),
    "specmoe.models.draft_head": ("specmoe_plugins.predictors.draft_head.model",
                                  ["DRAFT_HEAD_FORMAT", "DraftHeadConfig", "DraftHeadNet", "predict_sets",
                                   "save_draft_head", "load_draft_head"], None),
    "specmoe.training.draft_head_module": ("specmoe_plugins.predictors.draft_head.module",
                                           ["DraftHeadModule", "export_draft_head"], None),
    "specmoe.models.expert_predictor": ("specmoe_plugins.predictors.learned.model",
                                        ["RoutingPredictorNet", "build_backbone", "load_predictor",
                                         "DEFAULT_BACKBONE", "PREDICTOR_FORMAT"], None),
    "specmoe.training.predictor_module": ("specmoe_plugins.predictors.learned.module",
                                          ["PredictorModule", "export_from_checkpoint"], None),
    "specmoe.traces.token_table": ("specmoe_plugins.predictors.token_table.table",
                                   ["TokenTable", "build_token_table", "TABLE_FILE", "TABLE_META"], None),
    "specmoe.traces.collect": ("specmoe_plugins.stages.collect_traces.collect",
                               ["CollectOptions", "collect_traces", "split_samples", "plan_shards", "encode_turn",
                                "route_sequences", "usable_tokenizer", "trace_meta", "summarize"], None),
    "specmoe.models.attention": (f"{_HF}.attention", ["ATTN_IMPLEMENTATION", "grouped_attention", "register"], None),
    "specmoe.models.expert_bytes": (f"{_HF}.expert_bytes",
                                    ["ExpertBytes", "expert_bytes", "loaded_bytes_per_expert",
                                     "stored_bytes_per_expert"], None),
    "specmoe.models.graph": (f"{_HF}.graph", ["GraphDecoder", "row_linear", "project", "RowInvariantLinear",
                                              "MAX_ROWS"], None),
    "specmoe.models.lean": (f"{_HF}.lean", ["LeanDecoder"], None),
    "specmoe.training.pretrain": (f"{_TINY}.module",
                                  ["PretrainLM", "DEFAULT_BALANCE_RATE", "build_hf_config", "num_experts_of",
                                   "evaluate_blocks", "TRAIN_EXPERTS", "sorted_loop_experts_forward"], None),
    "specmoe.training.router_balance": (f"{_TINY}.router_balance",
                                        ["RouterCollapseError", "ExpertCounter", "BiasBalancer", "router_losses",
                                         "router_bias", "balance_stats", "check_router_collapse", "moe_layer_ids"],
                                        None),
    "specmoe.training.text_data": (f"{_TINY}.text_data",
                                   ["TextSource", "GSM8K_TRAIN", "FORMATTERS", "read_documents", "group_documents",
                                    "pack_documents", "TextDataModule", "SeededSampler"], None),
    "specmoe.training.tokenizer": (f"{_TINY}.tokenizer",
                                   ["BOS", "EOS", "PAD", "CHAT_TEMPLATE", "DOCUMENT_TEMPLATE", "train_bpe_tokenizer",
                                    "load_tokenizer", "render_exchange"], None),
    # the engine's own benchmarks became built-in bench plugins (their shared parts stay in specmoe.bench)
    "specmoe.bench.engine": (f"{_BENCHES}.engine.bench",
                             ["add_arguments", "run", "measure", "DEMO", "run_on_target", "count_step_ops",
                              "verifier_times"], None),
    "specmoe.bench.roofline": (f"{_BENCHES}.engine.roofline",
                               ["read_bandwidth", "module_bytes", "target_dense_bytes", "kv_bytes_per_slot",
                                "verify_bytes", "prune_cost"], None),
    "specmoe.bench.breakdown": (f"{_BENCHES}.engine.breakdown", ["verify_breakdown"], None),
    "specmoe.bench.tree": (f"{_BENCHES}.tree", ["add_arguments", "run", "measure", "parse_shapes"], None),
    "specmoe.bench.selector": (f"{_BENCHES}.selector",
                               ["add_arguments", "run", "CASES", "random_case", "build_selectors", "measure"], None),
    "specmoe.bench.peer": (f"{_VLLM}.bench", ["add_arguments", "run", "measure", "agreement", "check_draft"], None),
    "specmoe.peer.export": (f"{_VLLM}.export",
                            ["FORMAT", "read_token_table", "read_cost_model", "acceptance_from_run", "fit_vllm_steps",
                             "build_policy", "add_parser", "run"], None),
    "specmoe.peer.stage": (f"{_VLLM}.stage", ["VllmPeer", "summarise"], None),
}


#: old module -> the drafter plugin's module that replaced it (until commit 634c421 ``specmoe.drafting`` held the
#: EAGLE-3 / GTO / MTP internals): ``import <old>`` gives the new module itself, with a warning naming it
MOVED_MODULES: dict[str, str] = {
    "specmoe.drafting.eagle3_model": "specmoe_plugins.drafters.eagle3.model",
    "specmoe.drafting.eagle3_io": "specmoe_plugins.drafters.eagle3.checkpoint",
    "specmoe.drafting.eagle3_tree": "specmoe_plugins.drafters.eagle3.tree",
    "specmoe.drafting.eagle3_ttt": "specmoe_plugins.drafters.eagle3.ttt",
    "specmoe.drafting.vocab_map": "specmoe_plugins.drafters.eagle3.vocab_map",
    "specmoe.drafting.gto": "specmoe_plugins.drafters.gto.objective",
    "specmoe.drafting.mtp_io": "specmoe_plugins.drafters.mtp.checkpoint",
    "specmoe.drafting.mtp_model": "specmoe_plugins.drafters.mtp.model",
}
#: old package kept only as an alias -> where its modules went (importing it warns; it exports no names)
MOVED_PACKAGES: dict[str, str] = {"specmoe.drafting": "the drafter plugins' folders (specmoe_plugins.drafters.*)"}


def _warn_at_importer(message: str) -> None:
    """Warn as if from the line that imported the alias: the first frame outside this file and the import
    machinery (how deep that is depends on the import form, so it is looked up, not counted)."""
    frame = sys._getframe(1)
    while frame.f_back is not None and (frame.f_code.co_filename == __file__
                                        or "importlib" in frame.f_code.co_filename):
        frame = frame.f_back
    glob = frame.f_globals
    warnings.warn_explicit(message, DeprecationWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=glob.get("__name__"), registry=glob.setdefault("__warningregistry__", {}))


class _AliasLoader(importlib.abc.Loader):
    """Fills a fresh module for an old name of :data:`MOVED` or :data:`MOVED_PACKAGES`, or puts the new module
    itself in :data:`sys.modules` under an old name of :data:`MOVED_MODULES`."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        old = module.__name__
        if old in MOVED_MODULES:
            new_mod = MOVED_MODULES[old]
            _warn_at_importer(f"'{old}' moved to '{new_mod}'; reuse the drafter through the registry "
                              f"(specmoe.registry.drafters) or import '{new_mod}'; the alias will be removed in "
                              f"specmoe {REMOVED_IN}")
            # the import machinery returns whatever sys.modules holds under the name once this returns
            sys.modules[old] = importlib.import_module(new_mod)
            return
        if old in MOVED_PACKAGES:
            _warn_at_importer(f"'{old}' is deprecated: its modules moved into {MOVED_PACKAGES[old]} (see "
                              f"specmoe.utils.deprecation.MOVED_MODULES); this alias will be removed in specmoe "
                              f"{REMOVED_IN}")
            module.__doc__ = f"Deprecated alias package: its modules moved into {MOVED_PACKAGES[old]}."
            module.__all__ = []
            module.MOVED = {k: v for k, v in MOVED_MODULES.items() if k.startswith(old + ".")}

            def getattr_(name: str) -> ModuleType:
                if f"{old}.{name}" in MOVED_MODULES:
                    return importlib.import_module(f"{old}.{name}")
                raise AttributeError(f"module {old!r} has no attribute {name!r} (a deprecated alias package; "
                                     f"its modules: {', '.join(sorted(module.MOVED))})")

            module.__getattr__ = getattr_
            return
        new, names, use = MOVED[old]
        if names is None:
            names = importlib.import_module(new).__all__
        module.__doc__ = (f"Deprecated alias of ``{new}`` (kept through specmoe 0.2.x, removed in {REMOVED_IN}): "
                          f"every name taken from here is that module's object, with a DeprecationWarning; "
                          f"import it from ``{use or new}``.")
        module.__all__ = list(names)
        module.__getattr__, module.__dir__ = moved_names(old, new, module.__all__, use=use)


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds exactly the old names of the three tables (every other name is left to the other finders)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname in MOVED or fullname in MOVED_MODULES:
            return importlib.util.spec_from_loader(fullname, _AliasLoader())
        if fullname in MOVED_PACKAGES:
            return importlib.util.spec_from_loader(fullname, _AliasLoader(), is_package=True)
        return None


def install_aliases() -> None:
    """Put the finder of the alias tables on :data:`sys.meta_path`, once per process (also when this module is
    imported again, as by a test that clears :data:`sys.modules`)."""
    if not any(type(f).__name__ == _AliasFinder.__name__ and type(f).__module__ == __name__ for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
