# SPDX-License-Identifier: Apache-2.0
"""The ``draft_head`` predictor: fast top-K sets, the train_draft_head stage end to end (tiny: online target
and EAGLE-3 features, depths, in-memory feature cache, export, milestones, resume), the plugin on real draft
trees (one batched call, token table == embedding path), ``platform traces evaluate --drafter`` and the
clear errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specmoe.decoding.expert_sets import indices_to_sets, topk_mask
from specmoe.errors import UserError
from specmoe.interfaces.drafter import Committed
from specmoe.interfaces.stage import StageContext
from specmoe.registry import drafters, predictors, stages

DRAFTER = {"name": "eagle3", "init": {"seed": 1, "draft_vocab_size": 100}, "dtype": "float32"}


def test_topk_mask_equals_topk_and_handles_ties():
    g = torch.Generator().manual_seed(0)
    for shape in [(3, 7, 5, 32), (1, 11, 36, 128), (4, 6)]:
        z = torch.randn(*shape, generator=g)
        for k in (1, 2, 4):
            assert torch.equal(topk_mask(z, k), indices_to_sets(z.topk(k, dim=-1).indices, shape[-1]))
    tied = torch.zeros(2, 8)
    tied[:, :3] = 1.0  # three equal maxima, k = 2: the topk fallback keeps exactly two
    assert (topk_mask(tied, 2).sum(-1) == 2).all()


@pytest.fixture(scope="module")
def target(make_target):
    return make_target("qwen3_moe")


def _config(qwen3_traces, **kw):
    cls = stages.get("train_draft_head")
    opts = dict(traces=str(qwen3_traces), drafter=dict(DRAFTER), kind="mlp", rank=16, depths=2, lr=1e-2, batch_size=4,
                cache_features=True, milestones=[0.0, 0.99],
                trainer={"max_epochs": 6, "accelerator": "cpu", "enable_progress_bar": False, "num_threads": 1,
                         "log_every_n_steps": 1})
    opts.update(kw)
    return cls, cls.Config(**opts)


@pytest.fixture(scope="module")
def trained(qwen3_traces, tmp_path_factory):
    out = tmp_path_factory.mktemp("draft_head")
    cls, cfg = _config(qwen3_traces)
    return out, cls(cfg).run(out, StageContext())


def test_stage_outputs_and_learning(qwen3_traces, trained, target):
    from specmoe.traces.format import TraceReader
    from specmoe.training.trace_eval import evaluate_predictor

    out, summary = trained
    assert summary["global_step"] > 0 and len(summary["val_acc_per_depth"]) == 2
    assert len(summary["val_acc_per_layer"]) == target.num_moe_layers
    meta = json.loads((out / "head" / "draft_head.json").read_text())
    assert meta["config"]["kind"] == "mlp" and meta["drafter"]["name"] == "eagle3" and meta["depths"] == 2
    assert "acc00" in summary["milestones"] and (out / "milestones" / "acc00" / "draft_head.json").is_file()
    assert "acc99" not in summary["milestones"]
    assert "val/acc_d2" in (out / "logs" / "metrics.csv").read_text()
    # training helped: the exported head beats the same network untrained, through the decoding interface
    drafter = drafters.get("eagle3")(**{k: v for k, v in DRAFTER.items() if k != "name"})
    drafter.setup(target)
    reader = TraceReader(qwen3_traces)
    accs = {}
    for name, opts in {"trained": {"path": str(out / "head")},
                       "untrained": {"init": {"seed": 0, "kind": "mlp", "rank": 16}}}.items():
        pred = predictors.get("draft_head")(**opts)
        pred.setup(target)
        accs[name] = evaluate_predictor(pred, reader, "test", drafter=drafter, target=target)["acc"]
    assert accs["trained"] > accs["untrained"] + 0.05, accs
    assert accs["trained"] == pytest.approx(summary["val_acc"], abs=0.1)  # same data, same features (depth 1)


def test_feature_cache_returns_what_it_computed(qwen3_traces, target):
    from specmoe.training.predictor_data import RoutingTraceDataModule
    from specmoe_plugins.predictors.draft_head.module import DraftHeadModule

    drafter = drafters.get("eagle3")(**{k: v for k, v in DRAFTER.items() if k != "name"})
    drafter.setup(target)
    dm = RoutingTraceDataModule(qwen3_traces, 64, 3)
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()))
    module = DraftHeadModule(dict(feature_size=drafter.feature_size, embed_size=target.hidden_size,
                                  num_layers=3, num_experts=8, top_k=2), depths=2, cache_features=True)
    module.attach(target, drafter, target.embed(torch.arange(target.vocab_size)))
    first = module.features(batch, "val")
    assert set(module._memo) == {("val", int(w)) for w in batch["window"]}
    again = module.features(batch, "val")  # served from the memo
    for a, b in zip(first, again):
        torch.testing.assert_close(a, b)
    assert not torch.equal(first[0], first[1])  # depth 2 is a different drafter state


def test_stage_resumes_from_its_checkpoint(qwen3_traces, trained, tmp_path):
    src, first = trained
    out = tmp_path / "head"
    shutil.copytree(src, out)
    cls, cfg = _config(qwen3_traces)
    summary = cls(cfg).run(out, StageContext())
    assert summary["global_step"] == first["global_step"]  # nothing left to train: resumed at the end


def _tree(drafter, target, steps=3, top_k=2):
    from fixtures.tiny import random_prompts

    prompts = random_prompts(2, [9, 14], target.vocab_size, seed=3)
    ids = torch.tensor([p[:9] for p in prompts])
    out = target.forward(ids, target.new_kv(2), torch.arange(9).expand(2, 9),
                         hidden_layers=drafter.feature_layers)
    feats = torch.zeros(2, 9, out.hidden.shape[-1])
    feats[:, 1:] = out.hidden[:, :-1]
    committed = Committed(ids, torch.ones(2, 9, dtype=torch.bool), torch.arange(9).expand(2, 9), feats, True)
    return drafter.draft(drafter.begin(2), committed, steps, top_k)


def test_plugin_predicts_the_whole_tree_in_one_call(trained, target):
    out, _ = trained
    drafter = drafters.get("eagle3")(**{k: v for k, v in DRAFTER.items() if k != "name"})
    drafter.setup(target)
    tree = _tree(drafter, target)
    with_table = predictors.get("draft_head")(path=str(out / "head"))
    with_table.setup(target)
    no_table = predictors.get("draft_head")(path=str(out / "head"), token_table=False)
    no_table.setup(target)
    assert with_table._table is not None and no_table._table is None
    logits = with_table.predict_logits(tree)
    torch.testing.assert_close(logits, no_table.predict_logits(tree), rtol=1e-5, atol=1e-5)
    ref = no_table.net(tree.features, target.embed(tree.tokens))
    torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)
    tree.valid[1, 5:] = False
    sets = with_table.predict(None, tree)
    assert sets.shape == (2, tree.num_nodes, target.num_moe_layers, target.num_experts)
    assert (sets[tree.valid].sum(-1) == target.top_k).all() and not sets[~tree.valid].any()


def test_clear_errors(trained, target, tmp_path):
    out, _ = trained
    with pytest.raises(UserError, match="exactly one of 'path'"):
        predictors.get("draft_head")().setup(target)
    with pytest.raises(UserError, match="not an exported draft head"):
        predictors.get("draft_head")(path=str(tmp_path)).setup(target)
    pred = predictors.get("draft_head")(path=str(out / "head"))
    pred.setup(target)
    drafter = drafters.get("eagle3")(**{k: v for k, v in DRAFTER.items() if k != "name"})
    drafter.setup(target)
    tree = _tree(drafter, target)
    tree.features = None
    with pytest.raises(UserError, match="no node features"):
        pred.predict(None, tree)
    tree = _tree(drafter, target)
    tree.features = tree.features[..., :-1]
    with pytest.raises(UserError, match="trained on .*-wide features of another drafter"):
        pred.predict(None, tree)


def test_platform_traces_evaluate_with_drafter(qwen3_traces, trained, target, tmp_path, capsys):
    from specmoe.cli.main import main
    from specmoe_plugins.drafters.eagle3.checkpoint import save_eagle3

    out, summary = trained
    drafter = drafters.get("eagle3")(**{k: v for k, v in DRAFTER.items() if k != "name"})
    drafter.setup(target)
    draft_dir = save_eagle3(drafter.model, tmp_path / "eagle3")  # the drafter the head was trained on
    head = f"draft_head:path={out / 'head'}"
    assert main(["traces", "evaluate", "--traces", str(qwen3_traces), "-p", head, "--max-samples", "1"]) == 2
    assert "give a drafter" in capsys.readouterr().err
    assert main(["traces", "evaluate", "--traces", str(qwen3_traces), "-p", head, "-p", "router_on_embedding",
                 "--drafter", f"eagle3:path={draft_dir},dtype=float32"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res[head]["acc"] == pytest.approx(summary["val_acc"], abs=0.1)
    assert 0.0 <= res["router_on_embedding"]["acc"] <= 1.0


def test_method_with_a_featureless_drafter_is_one_clear_error(target):
    from specmoe.config.schema import Component, MethodConfig
    from specmoe.evaluation.method import Method

    @drafters.register("test_no_features")
    class NoFeatures(drafters.get("draft_model")):
        @property
        def feature_size(self) -> int:
            return 0

    cfg = MethodConfig(name="sd", drafter=Component("test_no_features", {"share_target": True}, "drafter"),
                       selector=Component("ecospec", {}, "selector"),
                       predictor=Component("draft_head", {"init": {"seed": 0}}, "predictor"))
    with pytest.raises(UserError, match="reads the drafter's node features.*test_no_features"):
        Method(cfg, target, lambda x: x)
