# SPDX-License-Identifier: Apache-2.0
"""The stable plugin API: everything a plugin (built-in or third-party) needs from specmoe, in one module::

    from specmoe.plugin_api import DraftTree, Selector, is_ancestor_closed

    class RootOnly(Selector):
        def select(self, tree: DraftTree, budget, experts=None, buffer=None):
            return tree.valid & (tree.depth == 0)

declared as entry points (``[project.entry-points."specmoe.selectors"]``) or named in a recipe
(``selector: {name: "pkg.mod:RootOnly"}``).

Stability: every name in ``__all__`` keeps its meaning and changes only compatibly within a minor series; a
renamed or removed name keeps working one more minor version with a :class:`DeprecationWarning`. Module
locations inside specmoe are not part of the promise; anything not listed here is internal.

What is here (``__all__``, in this order): the interfaces (:class:`Selector`, :class:`AdaptiveSelector`,
:class:`Drafter`, :class:`Predictor`, :class:`Verifier`, :class:`Target`, :class:`Dataset` /
:class:`BenchmarkDataset`, :class:`Stage`; base :class:`Plugin`); the values they exchange; helpers (tree
structure, expert sets, ancestor-closed greedy selection, the EAGLE-2/3 pool, :func:`torch_dtype`, recipe
components); the registries (plugins reuse each other through them, never by import); errors (:class:`UserError`,
:class:`InputError`); what runs a plugin, for its tests (:class:`SpeculativeEngine`, :func:`ar_generate`,
:class:`StopRule`). No Lightning, MLflow or plugin code is imported.
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
    "Plugin", "Selector", "AdaptiveSelector", "Drafter", "Predictor", "Verifier", "Target", "Dataset",
    "BenchmarkDataset", "Stage",
    "DraftTree", "KVState", "Committed", "TargetOutput", "TargetParts", "Sample", "StageContext",
    "SelectionContext", "SelectionPlan", "StepOutcome", "FloorOptions", "DType",
    "ancestor_matrix", "is_ancestor_closed", "close_under_ancestors", "path_experts", "indices_to_sets",
    "topk_mask", "pack_sets", "popcount_rows", "greedy_select", "greedy_packed", "PackedPool", "greedy_scalar",
    "ScalarPool", "SCALAR_POOL", "build_pool", "pool_size", "proposer_features", "torch_dtype", "Component",
    "component", "build_target", "build_option",
    "targets", "drafters", "selectors", "predictors", "verifiers", "datasets", "stages",
    "UserError", "InputError",
    "SpeculativeEngine", "ar_generate", "StopRule",
]
