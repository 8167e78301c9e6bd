# SPDX-License-Identifier: Apache-2.0
"""The stable plugin API (``specmoe.plugin_api``) and the deprecation aliases of moved modules: a third-party
selector package importing only from the API, and one written against last month's ``specmoe.decoding.tree``,
both load through the registry and decode exactly as AR in a real engine call; the aliases warn and name the
new place."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import textwrap
import warnings

import pytest
from fixtures.tiny import random_prompts

import specmoe.plugin_api as api
from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.stopping import StopRule
from specmoe.registry import drafters, predictors, selectors

#: a selector as a third party writes it: every specmoe name from specmoe.plugin_api (an expert-aware greedy
#: with the API's helpers: path footprints, ancestor-closed greedy, a closure check)
API_SELECTOR = '''
from dataclasses import dataclass

import torch

from specmoe.plugin_api import DraftTree, Selector, UserError, greedy_select, is_ancestor_closed, path_experts


class FewExperts(Selector):
    """P(path) / (1 + experts of the path): the greedy of EcoSpec without a buffer."""

    needs_experts = True
    description = "third-party test selector"

    @dataclass
    class Config:
        weight: float = 1.0

    def select(self, tree: DraftTree, budget: int, experts=None, buffer=None) -> torch.Tensor:
        if experts is None:
            raise UserError("FewExperts needs expert predictions")
        cost = path_experts(tree, experts).sum(dim=-1).float()
        score = tree.path_prob / (1.0 + self.config.weight * cost)
        sel = greedy_select(tree, budget, lambda chosen: score)
        assert bool((is_ancestor_closed(tree.parents, sel) | ~tree.valid[:, 0]).all())
        return sel
'''

#: the same kind of plugin written against last month's layout (DraftTree in specmoe.decoding.tree)
OLD_SELECTOR = '''
import torch

from specmoe.decoding.tree import DraftTree, close_under_ancestors
from specmoe.interfaces.selector import Selector


class TopPath(Selector):
    def select(self, tree: DraftTree, budget: int, experts=None, buffer=None) -> torch.Tensor:
        k = min(budget, tree.num_nodes)
        score = torch.where(tree.valid, tree.path_logp, torch.full_like(tree.path_logp, -1e9))
        score = score - tree.depth.float() * 1e-6  # ties towards the parent: the top set stays closed
        sel = torch.zeros_like(tree.valid).scatter_(1, score.topk(k, dim=1).indices, True) & tree.valid
        return close_under_ancestors(tree.parents, sel) & tree.valid
'''


def _package(tmp_path, monkeypatch, name: str, source: str) -> str:
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "selector.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}.selector"


def _specmoe_imports(source: str) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module)
        elif isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
    return {m for m in mods if m.split(".")[0].startswith("specmoe")}


@pytest.fixture(scope="module")
def setup(make_predictable, agreeing_drafts):
    """The predictable GPT-OSS target, a draft LM that agrees with it (so draft tokens get accepted), a
    predictor, prompts with their AR references."""
    target = make_predictable("gpt_oss")[0]
    drafter = drafters.get("draft_model")(path=str(agreeing_drafts("gpt_oss", "draft_lm")))
    drafter.setup(target)
    pred = predictors.get("router_on_embedding")()
    pred.setup(target)
    prompts = random_prompts(3, [3, 10, 19], target.vocab_size, seed=5)
    stop = StopRule(14)
    refs = ar_generate(target, prompts, temperature=0.0, stop=stop).tokens
    return target, drafter, pred, prompts, stop, refs


def _decode(setup, selector, gammas=(2, 4)) -> list:
    target, drafter, pred, prompts, stop, refs = setup
    engine = SpeculativeEngine(target, drafter, selector, pred)
    gens = []
    for gamma in gammas:
        out = engine.generate(prompts, budget=gamma, steps=3, top_k=2, temperature=0.0, stop=stop)
        assert out.tokens == refs, f"{type(selector).__name__} gamma={gamma} differs from AR"
        gens.append(out)
    accepted = [a for g in gens for s in g.steps for a in s.accepted]
    assert sum(a >= 2 for a in accepted) >= 0.3 * len(accepted), "the selector's draft nodes were not accepted"
    return gens


def test_third_party_selector_on_the_stable_api(setup, tmp_path, monkeypatch):
    assert _specmoe_imports(API_SELECTOR) == {"specmoe.plugin_api"}
    path = _package(tmp_path, monkeypatch, "thirdparty_fewexperts", API_SELECTOR)
    selectors.register("tp_few_experts", target=f"{path}:FewExperts")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)  # the stable API itself warns about nothing
            cls = selectors.get("tp_few_experts")
        assert cls is selectors.get(f"{path}:FewExperts")  # the recipe form 'pkg.mod:Class' too
        assert issubclass(cls, api.Selector) and cls.needs_experts
        _decode(setup, cls(weight=0.5))
    finally:
        selectors.unregister("tp_few_experts")


def test_selector_against_the_old_tree_module_loads_with_a_warning(setup, tmp_path, monkeypatch):
    assert "specmoe.decoding.tree" in _specmoe_imports(OLD_SELECTOR)
    path = _package(tmp_path, monkeypatch, "thirdparty_oldtree", OLD_SELECTOR)
    with pytest.warns(DeprecationWarning, match=r"'specmoe.decoding.tree.DraftTree' moved to "
                                                r"'specmoe.interfaces.tree.DraftTree'.*specmoe.plugin_api") as rec:
        cls = selectors.get(f"{path}:TopPath")
    moved = {str(w.message).split("'")[1] for w in rec if issubclass(w.category, DeprecationWarning)}
    assert moved >= {"specmoe.decoding.tree.DraftTree", "specmoe.decoding.tree.close_under_ancestors"}
    assert any(w.filename.endswith("selector.py") for w in rec), "the warning points at the plugin's import"
    mod = importlib.import_module(path)
    assert mod.DraftTree is api.DraftTree and mod.close_under_ancestors is api.close_under_ancestors
    _decode(setup, cls())


def test_old_tree_module_rejects_unknown_names():
    import specmoe.decoding.tree as old

    with pytest.raises(AttributeError, match="deprecated alias of 'specmoe.interfaces.tree'"):
        old.KVState  # noqa: B018 - never was in the tree module


def test_every_name_in_all_resolves():
    assert len(api.__all__) == len(set(api.__all__))
    missing = [n for n in api.__all__ if getattr(api, n, None) is None]
    assert not missing, missing
    for name in ("Selector", "Drafter", "Predictor", "Verifier", "Target", "Stage", "BenchmarkDataset", "Dataset",
                 "DraftTree", "KVState", "Committed", "TargetOutput", "is_ancestor_closed", "path_experts"):
        assert name in api.__all__, name
    # each is the object the rest of specmoe uses, not a copy
    from specmoe.interfaces.tree import DraftTree
    from specmoe.registry import selectors as reg

    assert api.DraftTree is DraftTree and api.selectors is reg


def test_plugin_api_imports_no_training_tracking_or_plugins():
    code = ("import sys, specmoe.plugin_api; "
            "print([m for m in ('lightning', 'mlflow', 'specmoe_plugins', 'specmoe.training', 'specmoe.tracking', "
            "'specmoe.evaluation') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_drafting_alias_gives_the_moved_modules(monkeypatch):
    """``specmoe.drafting`` (the EAGLE-3 / GTO / MTP internals until commit 634c421): the package and every old
    submodule import, warn naming the new module, and are the new module itself."""
    for name in [m for m in sys.modules if m == "specmoe.drafting" or m.startswith("specmoe.drafting.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.warns(DeprecationWarning, match=r"'specmoe.drafting' is deprecated.*removed in specmoe 0.3.0"):
        drafting = importlib.import_module("specmoe.drafting")
    expected = {"eagle3_model": "eagle3.model", "eagle3_io": "eagle3.checkpoint", "eagle3_tree": "eagle3.tree",
                "eagle3_ttt": "eagle3.ttt", "vocab_map": "eagle3.vocab_map", "gto": "gto.objective",
                "mtp_io": "mtp.checkpoint", "mtp_model": "mtp.model"}
    assert drafting.MOVED == {f"specmoe.drafting.{old}": f"specmoe_plugins.drafters.{new}"
                              for old, new in expected.items()}
    for old, new in expected.items():
        new_name = f"specmoe_plugins.drafters.{new}"
        with pytest.warns(DeprecationWarning, match=rf"'specmoe.drafting.{old}' moved to '{new_name}'"):
            alias = importlib.import_module(f"specmoe.drafting.{old}")
        assert alias is importlib.import_module(new_name)
        assert alias.__spec__.name == new_name  # the real module is left as it was
    monkeypatch.delitem(sys.modules, "specmoe.drafting.mtp_io")
    monkeypatch.delattr(drafting, "mtp_io")
    with pytest.warns(DeprecationWarning, match="mtp.checkpoint"):
        from specmoe.drafting import mtp_io
    real = importlib.import_module("specmoe_plugins.drafters.mtp.checkpoint")
    assert mtp_io.read_mtp_tensors is real.read_mtp_tensors
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("specmoe.drafting.eagle3_drafter")  # never existed


def test_old_kv_module_gives_the_moved_names_with_a_warning():
    import specmoe.decoding.kv as old
    from specmoe.interfaces import kv as new

    for name in old.__all__:
        with pytest.warns(DeprecationWarning, match=rf"'specmoe.decoding.kv.{name}' moved to 'specmoe.interfaces.kv"):
            assert getattr(old, name) is getattr(new, name)


#: core modules that moved into a built-in plugin's folder (issue 24.1): old module -> (new module, names)
MOVED_INTO_PLUGINS = {
    "specmoe.models.expert_predictor": ("specmoe_plugins.predictors.learned.model",
                                        ["RoutingPredictorNet", "build_backbone", "load_predictor",
                                         "DEFAULT_BACKBONE", "PREDICTOR_FORMAT"]),
    "specmoe.training.predictor_module": ("specmoe_plugins.predictors.learned.module",
                                          ["PredictorModule", "export_from_checkpoint"]),
    "specmoe.models.draft_head": ("specmoe_plugins.predictors.draft_head.model",
                                  ["DRAFT_HEAD_FORMAT", "DraftHeadConfig", "DraftHeadNet", "predict_sets",
                                   "save_draft_head", "load_draft_head"]),
    "specmoe.training.draft_head_module": ("specmoe_plugins.predictors.draft_head.module",
                                           ["DraftHeadModule", "export_draft_head"]),
    "specmoe.traces.token_table": ("specmoe_plugins.predictors.token_table.table",
                                   ["TokenTable", "build_token_table", "TABLE_FILE", "TABLE_META"]),
    "specmoe.bench.predictor": ("specmoe_plugins.predictors.draft_head.bench",
                                ["add_arguments", "run", "GPTOSS120B", "head_case", "demo_target", "learned_case"]),
    "specmoe.training.pretrain": ("specmoe_plugins.targets.tiny.module",
                                  ["PretrainLM", "DEFAULT_BALANCE_RATE", "build_hf_config", "num_experts_of",
                                   "evaluate_blocks", "TRAIN_EXPERTS", "sorted_loop_experts_forward"]),
    "specmoe.training.text_data": ("specmoe_plugins.targets.tiny.text_data",
                                   ["TextSource", "GSM8K_TRAIN", "FORMATTERS", "read_documents", "group_documents",
                                    "pack_documents", "TextDataModule", "SeededSampler"]),
    "specmoe.training.tokenizer": ("specmoe_plugins.targets.tiny.tokenizer",
                                   ["BOS", "EOS", "PAD", "CHAT_TEMPLATE", "DOCUMENT_TEMPLATE", "train_bpe_tokenizer",
                                    "load_tokenizer", "render_exchange"]),
    "specmoe.training.router_balance": ("specmoe_plugins.targets.tiny.router_balance",
                                        ["RouterCollapseError", "ExpertCounter", "BiasBalancer", "router_losses",
                                         "router_bias", "balance_stats", "check_router_collapse", "moe_layer_ids"]),
    "specmoe.decoding.cost_model": ("specmoe_plugins.selectors.goodput.cost_model",
                                    ["FEATURES", "DEFAULT_FEATURES", "VerifyShape", "CostModel", "huber_fit",
                                     "relative_errors"]),
    "specmoe.bench.cost_calibration": ("specmoe_plugins.selectors.goodput.calibration",
                                       ["grid", "calibrate", "shape_of", "fit_split", "engine_check"]),
    "specmoe.bench.goodput": ("specmoe_plugins.selectors.goodput.bench", ["add_arguments", "run", "measure"]),
    "specmoe.bench.engine": ("specmoe_plugins.benches.engine.bench",
                             ["add_arguments", "run", "measure", "DEMO", "run_on_target", "count_step_ops",
                              "verifier_times"]),
    "specmoe.bench.roofline": ("specmoe_plugins.benches.engine.roofline",
                               ["read_bandwidth", "module_bytes", "target_dense_bytes", "kv_bytes_per_slot",
                                "verify_bytes", "prune_cost"]),
    "specmoe.bench.breakdown": ("specmoe_plugins.benches.engine.breakdown", ["verify_breakdown"]),
    "specmoe.bench.tree": ("specmoe_plugins.benches.tree", ["add_arguments", "run", "measure", "parse_shapes"]),
    "specmoe.bench.selector": ("specmoe_plugins.benches.selector",
                               ["add_arguments", "run", "CASES", "random_case", "build_selectors", "measure"]),
    "specmoe.kernels.union_torch": ("specmoe_plugins.verifiers.union.reference",
                                    ["union_experts_forward", "grouped_supported", "prepare", "packed_experts",
                                     "PACK_MAX_BYTES", "graph_experts"]),
    "specmoe.kernels.layout": ("specmoe_plugins.verifiers.union.layout",
                               ["ExpertsLayout", "experts_layout", "expert_forward", "apply_gate", "ACT_SILU",
                                "ACT_SWIGLU_OAI"]),
    "specmoe.bench.verifier": ("specmoe_plugins.verifiers.union.bench",
                               ["add_arguments", "run", "LayerSpec", "MODELS", "TINY_MODELS", "build_experts",
                                "union_routing", "sweep"]),
    "specmoe.bench.expert_latency": ("specmoe_plugins.selectors.goodput.expert_latency",
                                     ["add_arguments", "run", "forced_routing", "override_routers", "fit_line",
                                      "measure"]),
    "specmoe.models.attention": ("specmoe_plugins.targets.hf.attention",
                                 ["ATTN_IMPLEMENTATION", "grouped_attention", "register"]),
    "specmoe.kernels.union_moe": ("specmoe_plugins.verifiers.union.kernels",
                                  ["UnionBlocks", "union_moe", "is_interpreted"]),
    "specmoe.kernels.routing_meta": ("specmoe_plugins.verifiers.union.routing_meta",
                                     ["RoutingMeta", "routing_meta"]),
    "specmoe.traces.collect": ("specmoe_plugins.stages.collect_traces.collect",
                               ["CollectOptions", "collect_traces", "split_samples", "plan_shards", "encode_turn",
                                "route_sequences", "usable_tokenizer", "trace_meta", "summarize"]),
    "specmoe.models.lean": ("specmoe_plugins.targets.hf.lean", ["LeanDecoder"]),
    "specmoe.models.graph": ("specmoe_plugins.targets.hf.graph",
                             ["GraphDecoder", "row_linear", "project", "RowInvariantLinear", "MAX_ROWS"]),
    "specmoe.models.expert_bytes": ("specmoe_plugins.targets.hf.expert_bytes",
                                    ["ExpertBytes", "expert_bytes", "loaded_bytes_per_expert",
                                     "stored_bytes_per_expert"]),
}


@pytest.mark.parametrize("old", sorted(MOVED_INTO_PLUGINS))
def test_core_modules_moved_into_plugin_folders_keep_their_names_with_a_warning(old):
    new, names = MOVED_INTO_PLUGINS[old]
    alias = importlib.import_module(old)
    assert sorted(alias.__all__) == sorted(names) and dir(alias) == sorted(names)
    for name in names:
        with pytest.warns(DeprecationWarning, match=rf"'{old}.{name}' moved to '{new}.{name}': import it from "
                                                    rf"'{new}'.* removed in specmoe 0.3.0"):
            assert getattr(alias, name) is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError, match=f"deprecated alias of '{new}'"):
        alias.no_such_name  # noqa: B018


def test_moved_module_aliases_import_no_plugin_until_a_name_is_taken():
    code = (f"import importlib, sys; [importlib.import_module(m) for m in {sorted(MOVED_INTO_PLUGINS)!r}]; "
            "print(sorted(m for m in sys.modules if m.startswith('specmoe_plugins')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
