# SPDX-License-Identifier: Apache-2.0
"""The stable plugin API: everything a plugin (a selector, drafter, predictor, verifier, target, dataset or
stage, built-in or third-party) needs from specmoe, in one module.

Write plugins against this module::

    from specmoe.plugin_api import DraftTree, Selector, is_ancestor_closed

    class RootOnly(Selector):
        def select(self, tree: DraftTree, budget, experts=None, buffer=None):
            return tree.valid & (tree.depth == 0)

and declare them as entry points (``[project.entry-points."specmoe.selectors"] root_only = "pkg.mod:RootOnly"``)
or name them in a recipe (``selector: {name: "pkg.mod:RootOnly"}``).

Stability promise
    Every name in ``__all__`` stays importable from ``specmoe.plugin_api`` with the same meaning, and its
    signature changes only compatibly (new arguments have defaults, new dataclass fields are optional), within
    a minor version series (0.1.x, 0.2.x, ...). A name that is renamed or removed first keeps working for one
    more minor version with a :class:`DeprecationWarning` naming its replacement. Where things live inside
    specmoe (``specmoe.interfaces.*``, ``specmoe.decoding.*``, ...) is *not* part of the promise: modules move
    (a moved module keeps a deprecation alias for one minor version, as ``specmoe.decoding.tree`` and
    ``specmoe.drafting`` do now), this module follows them. Anything not listed here (training helpers,
    evaluation, tracking, the CLI) is internal.

What is here
    * the interfaces, one per kind (tensor shapes on every method): :class:`Selector` and
      :class:`AdaptiveSelector` (with :class:`SelectionContext`, :class:`SelectionPlan`, :class:`StepOutcome`,
      :class:`FloorOptions`), :class:`Drafter`, :class:`Predictor`, :class:`Verifier`, :class:`Target`,
      :class:`Dataset` / :class:`BenchmarkDataset`, :class:`Stage`, and their common base :class:`Plugin`;
    * the values they exchange: :class:`DraftTree`, :class:`KVState`, :class:`Committed`,
      :class:`TargetOutput`, :class:`TargetParts`, :class:`Sample`, :class:`StageContext`, :class:`DType`;
    * helpers the built-in plugins use: tree structure (:func:`ancestor_matrix`, :func:`is_ancestor_closed`,
      :func:`close_under_ancestors`), expert sets (:func:`path_experts`, :func:`indices_to_sets`,
      :func:`topk_mask`, :func:`pack_sets`, :func:`popcount_rows`), ancestor-closed greedy selection
      (:func:`greedy_select`, :func:`greedy_packed` / :class:`PackedPool`, :func:`greedy_scalar` /
      :class:`ScalarPool`, :data:`SCALAR_POOL`), the EAGLE-2/3 candidate pool (:func:`build_pool`,
      :func:`pool_size`, :func:`proposer_features`), :func:`torch_dtype`, recipe components of stages
      (:class:`Component`, :func:`component`, :func:`build_target`, :func:`build_option`);
    * the registries, through which plugins reuse each other (``drafters.get("eagle3")``; a plugin never
      imports another);
    * errors: :class:`UserError` (bad input or a missing resource: one message, no traceback) and
      :class:`InputError`;
    * what runs a plugin, for its own tests: :class:`SpeculativeEngine`, :func:`ar_generate`,
      :class:`StopRule`.

This module imports no Lightning, MLflow or plugin code (only torch and numpy beyond the standard library).
"""

from __future__ import annotations

from specmoe.config.schema import Component, component
from specmoe.data.base import BenchmarkDataset
from specmoe.decoding.ar import ar_generate
from specmoe.decoding.bitsets import pack_sets, popcount_rows
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.expert_sets import indices_to_sets, topk_mask
from specmoe.decoding.inputs import InputError
from specmoe.decoding.selection import (
    SCALAR_POOL,
    PackedPool,
    ScalarPool,
    greedy_packed,
    greedy_scalar,
    greedy_select,
    path_experts,
)
from specmoe.decoding.stopping import StopRule
from specmoe.decoding.tree_builder import build_pool, pool_size, proposer_features
from specmoe.errors import UserError
from specmoe.interfaces.dataset import Dataset, Sample
from specmoe.interfaces.drafter import Committed, Drafter
from specmoe.interfaces.kv import KVState
from specmoe.interfaces.options import DType, torch_dtype
from specmoe.interfaces.plugin import Plugin
from specmoe.interfaces.predictor import Predictor
from specmoe.interfaces.selection import (
    AdaptiveSelector,
    FloorOptions,
    SelectionContext,
    SelectionPlan,
    StepOutcome,
)
from specmoe.interfaces.selector import Selector
from specmoe.interfaces.stage import Stage, StageContext
from specmoe.interfaces.target import Target, TargetOutput, TargetParts
from specmoe.interfaces.tree import DraftTree, ancestor_matrix, close_under_ancestors, is_ancestor_closed
from specmoe.interfaces.verifier import Verifier
from specmoe.registry import datasets, drafters, predictors, selectors, stages, targets, verifiers
from specmoe.stages.options import build_option, build_target

__all__ = [
    # interfaces
    "Plugin", "Selector", "AdaptiveSelector", "Drafter", "Predictor", "Verifier", "Target", "Dataset",
    "BenchmarkDataset", "Stage",
    # values
    "DraftTree", "KVState", "Committed", "TargetOutput", "TargetParts", "Sample", "StageContext",
    "SelectionContext", "SelectionPlan", "StepOutcome", "FloorOptions", "DType",
    # helpers
    "ancestor_matrix", "is_ancestor_closed", "close_under_ancestors", "path_experts", "indices_to_sets",
    "topk_mask", "pack_sets", "popcount_rows", "greedy_select", "greedy_packed", "PackedPool", "greedy_scalar",
    "ScalarPool", "SCALAR_POOL", "build_pool", "pool_size", "proposer_features", "torch_dtype", "Component",
    "component", "build_target", "build_option",
    # registries
    "targets", "drafters", "selectors", "predictors", "verifiers", "datasets", "stages",
    # errors
    "UserError", "InputError",
    # running a plugin
    "SpeculativeEngine", "ar_generate", "StopRule",
]
