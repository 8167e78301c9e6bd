# SPDX-License-Identifier: Apache-2.0
"""Aliases of moved modules: every name taken from the old place is the new place's object, with a warning.

:data:`MOVED` lists every deprecated module path of the core; no file stands for one. :func:`install_aliases`
(run once by ``specmoe/__init__.py``) puts a finder on :data:`sys.meta_path` that makes ``import <old>``, ``from
<package> import <old>`` and ``importlib.util.find_spec(<old>)`` find a module whose names come from
:func:`moved_names`. The new module stays a name until a name is first taken: the core imports no plugin.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any, Callable

__all__ = ["moved_names", "REMOVED_IN", "MOVED", "install_aliases"]

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
    "specmoe.bench.peer": (f"{_VLLM}.bench", ["add_arguments", "run", "measure", "agreement", "check_draft"], None),
    "specmoe.peer.export": (f"{_VLLM}.export",
                            ["FORMAT", "read_token_table", "read_cost_model", "acceptance_from_run", "fit_vllm_steps",
                             "build_policy", "add_parser", "run"], None),
    "specmoe.peer.stage": (f"{_VLLM}.stage", ["VllmPeer", "summarise"], None),
}


class _AliasLoader(importlib.abc.Loader):
    """Fills a fresh module for an old name of :data:`MOVED` (the module machinery's default one)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        new, names, use = MOVED[module.__name__]
        if names is None:
            names = importlib.import_module(new).__all__
        module.__doc__ = (f"Deprecated alias of ``{new}`` (kept through specmoe 0.2.x, removed in {REMOVED_IN}): "
                          f"every name taken from here is that module's object, with a DeprecationWarning; "
                          f"import it from ``{use or new}``.")
        module.__all__ = list(names)
        module.__getattr__, module.__dir__ = moved_names(module.__name__, new, module.__all__, use=use)


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds exactly the old names of :data:`MOVED` (every other name is left to the other finders)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader())


def install_aliases() -> None:
    """Put the finder of :data:`MOVED` on :data:`sys.meta_path`, once per process (also when this module is
    imported again, as by a test that clears :data:`sys.modules`)."""
    if not any(type(f).__name__ == _AliasFinder.__name__ and type(f).__module__ == __name__ for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
