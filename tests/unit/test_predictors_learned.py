# SPDX-License-Identifier: Apache-2.0
"""Expert predictors: eq. 5-6 loss, top-K accuracy metric, learned tree pass vs path-by-path scoring,
token-table lookups and fallback, the train_predictor stage end to end (tiny)."""

from __future__ import annotations

import math

import pytest
import torch

from specmoe.interfaces.drafter import Committed
from specmoe.interfaces.stage import StageContext
from specmoe.interfaces.tree import DraftTree
from specmoe.registry import predictors, stages
from specmoe.training.routing_metrics import TopKRoutingAccuracy, routing_loss, routing_targets


@pytest.fixture(scope="module")
def target(make_target):
    return make_target("qwen3_moe")


@pytest.fixture(scope="module")
def traces(qwen3_traces):
    return qwen3_traces


@pytest.fixture(scope="module")
def trained(traces, tmp_path_factory):
    out = tmp_path_factory.mktemp("predictor")
    cls = stages.get("train_predictor")
    summary = cls(cls.Config(traces=str(traces), lr=3e-3, max_len=16, batch_size=4, milestones=[0.0, 0.99],
                             trainer={"max_epochs": 2, "accelerator": "cpu", "enable_progress_bar": False,
                                      "num_threads": 1, "log_every_n_steps": 1})).run(out, StageContext())
    return out, summary


# ---------------------------------------------------------------------------------------------- loss, metric
def test_loss_is_layerwise_cross_entropy_against_uniform_topk():
    # one token, L = 2 layers, E = 4 experts, K = 2
    logits = torch.tensor([[[2.0, 0.0, 1.0, -1.0], [0.0, 0.0, 0.0, 3.0]]])
    routing = torch.tensor([[[0, 2], [1, 3]]])
    q = routing_targets(routing, 4)
    assert torch.equal(q, torch.tensor([[[0.5, 0, 0.5, 0], [0, 0.5, 0, 0.5]]]))
    z0 = math.log(math.exp(2) + 1 + math.exp(1) + math.exp(-1))
    z1 = math.log(3 + math.exp(3))
    want = -0.5 * ((2 - z0) + (1 - z0)) - 0.5 * ((0 - z1) + (3 - z1))  # -sum_l sum_e q log softmax
    loss, terms = routing_loss(logits, routing, torch.tensor([True]))
    assert loss.item() == pytest.approx(want, rel=1e-6) and terms.item() == 2
    # padding contributes nothing; the minimum over logits is log K, reached by equal logits on the top-K
    pad_loss, pad_terms = routing_loss(logits.expand(2, 2, 4), routing.expand(2, 2, 2),
                                       torch.tensor([True, False]))
    assert pad_loss.item() == pytest.approx(want, rel=1e-6) and pad_terms.item() == 2
    best = torch.where(q > 0, 30.0, -30.0)
    floor = routing_loss(best, routing, torch.tensor([True]))[0].item()
    assert floor == pytest.approx(2 * math.log(2), rel=1e-4)


def test_topk_accuracy_per_layer_overall_and_merge():
    routing = torch.tensor([[[0, 1], [2, 3]], [[0, 1], [2, 3]], [[4, 5], [6, 7]]])  # [T=3, L=2, K=2]
    logits = torch.zeros(3, 2, 8)
    logits[0, 0, [0, 1]] = 1  # 2/2
    logits[0, 1, [2, 5]] = 1  # 1/2
    logits[1, 0, [6, 7]] = 1  # 0/2
    logits[1, 1, [3, 2]] = 1  # 2/2
    logits[2, :, :] = -5  # token 2 is padding: ignored
    metric = TopKRoutingAccuracy(num_layers=2, top_k=2)
    metric.update(logits, routing, torch.tensor([True, True, False]))
    res = metric.compute()
    assert res["acc_per_layer"].tolist() == pytest.approx([0.5, 0.75])
    assert res["acc"].item() == pytest.approx(0.625)
    # bool sets are accepted as predictions; states add up across processes (what DDP sync does: "sum")
    a, b = TopKRoutingAccuracy(2, 2), TopKRoutingAccuracy(2, 2)
    sets = torch.zeros(3, 2, 8, dtype=torch.bool).scatter_(-1, logits.topk(2, dim=-1).indices, True)
    a.update(sets[:1], routing[:1])
    b.update(sets[1:2], routing[1:2])
    a.merge_state(b)
    assert a.compute()["acc"].item() == pytest.approx(0.625)
    assert all(fx is not None for fx in metric._reductions.values())


# ---------------------------------------------------------------------------------------------- learned
def _tree(parents: list[int], tokens: torch.Tensor) -> DraftTree:
    b, n = tokens.shape
    depth = torch.zeros(b, n, dtype=torch.long)
    for i in range(1, n):
        depth[:, i] = depth[:, parents[i]] + 1
    par = torch.tensor(parents).expand(b, n).clone()
    z = torch.zeros(b, n)
    return DraftTree(tokens, par, depth, z, z.clone(), torch.ones(b, n, dtype=torch.bool))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_learned_tree_pass_equals_scoring_each_path(target, trained, attn):
    from specmoe.decoding.engine import pad_rows

    out, _ = trained
    pred = predictors.get("learned")(path=str(out / "predictor"), attn_implementation=attn)
    pred.setup(target)
    g = torch.Generator().manual_seed(1)
    rand = lambda n: torch.randint(0, target.vocab_size, (n,), generator=g).tolist()  # noqa: E731
    ctx = [rand(7), rand(4)]  # two rows with different committed lengths, committed in two steps
    state = pred.begin(2)
    ids, valid = pad_rows(ctx, target.device)
    pred.observe(state, Committed(ids, valid, torch.arange(ids.shape[1]).expand_as(ids), first=True))
    more = [rand(3), rand(1)]
    ids2, valid2 = pad_rows(more, target.device)
    pred.observe(state, Committed(ids2, valid2, torch.tensor([[7], [4]]) + torch.arange(3)[None]))
    ctx = [a + b for a, b in zip(ctx, more)]
    parents = [-1, 0, 0, 1, 1, 2, 3, 5, 7]
    tokens = torch.randint(0, target.vocab_size, (2, len(parents)), generator=g)
    tokens[:, 0] = torch.tensor([c[-1] for c in ctx])  # the root is the last committed token
    tree = _tree(parents, tokens)
    slots = state.kv.num_slots
    logits = pred.predict_logits(state, tree)
    assert state.kv.num_slots == slots  # the tree's slots are forgotten
    for b in range(2):
        for i in range(len(parents)):
            path = [i]
            while parents[path[-1]] > 0:
                path.append(parents[path[-1]])
            seq = torch.tensor(ctx[b] + (tokens[b, path[::-1]].tolist() if i else []))[None]
            ref = pred.net(target.embed(seq), position_ids=torch.arange(seq.shape[1])[None])[0, -1]
            torch.testing.assert_close(logits[b, i], ref, atol=2e-5, rtol=1e-4)
    tree.valid[1, 4:] = False
    sets = pred.predict(state, tree)
    assert sets.shape == (2, len(parents), 3, 8) and sets.dtype == torch.bool
    assert (sets[tree.valid].sum(-1) == 2).all() and not sets[~tree.valid].any()


def test_learned_init_is_a_seeded_untrained_predictor_and_path_or_init_is_required(target, trained):
    from specmoe.errors import UserError

    small = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
             "head_dim": 16}
    nets = []
    for seed in (3, 3, 4):
        pred = predictors.get("learned")(init={**small, "seed": seed})
        pred.setup(target)
        nets.append(pred.net.state_dict())
        assert pred.net.backbone.config.hidden_size == 32 and pred.meta["random_weights"]
    assert all(torch.equal(nets[0][k], nets[1][k]) for k in nets[0])
    assert not torch.equal(nets[0]["head.weight"], nets[2]["head.weight"])
    state = pred.begin(1)
    pred.observe(state, Committed(torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.bool),
                                  torch.arange(3)[None], first=True))
    tree = _tree([-1, 0, 0], torch.tensor([[3, 4, 5]]))
    assert (pred.predict(state, tree).sum(-1) == target.top_k).all()
    out, _ = trained
    for options in ({}, {"path": str(out / "predictor"), "init": small}):
        with pytest.raises(UserError, match="exactly one of 'path'.*'init'"):
            predictors.get("learned")(**options).setup(target)


def test_train_predictor_stage_outputs(traces, trained):
    from specmoe.traces.format import TraceReader

    out, summary = trained
    windows = sum(math.ceil(r.length / 16) for r in TraceReader(traces).samples("train"))
    assert summary["global_step"] == 2 * math.ceil(windows / 4)  # 2 epochs of global batches of 4 windows
    assert 0.0 <= summary["val_acc"] <= 1.0 and len(summary["val_acc_per_layer"]) == 3
    assert (out / "checkpoints" / "last.ckpt").is_file()
    assert (out / "predictor" / "model.safetensors").is_file()
    assert "acc00" in summary["milestones"] and (out / "milestones" / "acc00" / "predictor.json").is_file()
    assert "acc99" not in summary["milestones"]
    assert (out / "logs" / "metrics.csv").read_text().count("val/acc") >= 1


def test_train_predictor_survives_a_truncated_last_checkpoint(traces, trained, tmp_path, caplog):
    """A killed save leaves half a last.ckpt: the rerun says so, keeps it aside and trains (no traceback)."""
    import logging
    import shutil

    src, first = trained
    out = tmp_path / "predictor"
    shutil.copytree(src, out)
    last = out / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])
    cls = stages.get("train_predictor")
    with caplog.at_level(logging.WARNING):
        summary = cls(cls.Config(traces=str(traces), lr=3e-3, max_len=16, batch_size=4, milestones=[],
                                 trainer={"max_epochs": 2, "accelerator": "cpu", "enable_progress_bar": False,
                                          "num_threads": 1, "log_every_n_steps": 1})).run(out, StageContext())
    assert "damaged checkpoint" in caplog.text and "last.ckpt" in caplog.text
    assert (out / "checkpoints" / "last.ckpt.damaged").is_file()  # kept for inspection, never deleted
    assert summary["global_step"] == first["global_step"]  # trained its whole budget again from step 0


def test_platform_traces_evaluate(target, traces, capsys):
    import json

    from specmoe.cli.main import main

    assert main(["traces", "evaluate", "--traces", str(traces), "-p", "router_on_embedding",
                 "--max-samples", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("router_on_embedding: acc=")
    res = json.loads(out[-1])["router_on_embedding"]
    assert 0.0 <= res["acc"] <= 1.0 and res["samples"] == 1
    assert main(["traces", "evaluate", "--traces", str(traces), "-p", "token_table:path"]) == 2
    assert "is not KEY=VALUE" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- token table
def _write_traces(root, rows):
    """Hand-made traces for a (L=3, E=8, K=2) target: ``rows`` = [(token ids, [T, 3, 2] routing)]."""
    from specmoe.traces.format import SampleTrace, TraceMeta, TraceWriter

    w = TraceWriter(root, TraceMeta(3, 8, 2, 256, 64), "hand")
    w.write_shard("train-00000", "train", [SampleTrace(f"s{i}", torch.tensor(t), torch.tensor(r), 1)
                                            for i, (t, r) in enumerate(rows)])
    w.write_index(["train-00000"])


def test_token_table_lookup_and_fallback(target, tmp_path):
    from specmoe.traces.format import TraceReader
    from specmoe_plugins.predictors.token_table.table import build_token_table

    a = [[0, 1], [2, 3], [4, 5]]
    b = [[6, 7], [2, 4], [4, 5]]
    c = [[0, 1], [2, 3], [5, 6]]
    _write_traces(tmp_path / "tr", [([5, 9, 5], [a, c, a]), ([5, 7], [b, c])])
    table = build_token_table(TraceReader(tmp_path / "tr"))
    assert table.token_ids.tolist() == [5, 7, 9] and table.token_counts.tolist() == [3, 1, 1]
    # token 5: layer 0 saw {0,1} twice and {6,7} once; layer 1 {2,3},{2,3},{2,4} -> 2 then 3
    assert table.lookup(torch.tensor([5]))[0].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert table.lookup(torch.tensor([9]))[0].tolist() == c
    # unseen token -> global most frequent per layer (ties -> lower expert id)
    # layer 0 counts: 0:4 1:4 6:1 7:1; layer 1: 2:5 3:4 4:1; layer 2: 4:3 5:5 6:2
    fallback = [[0, 1], [2, 3], [5, 4]]
    assert table.lookup(torch.tensor([100, 255]))[1].tolist() == fallback
    assert build_token_table(TraceReader(tmp_path / "tr"), min_count=2).token_ids.tolist() == [5]
    table.save(tmp_path / "table")
    pred = predictors.get("token_table")(path=str(tmp_path / "table"))
    pred.setup(target)
    tree = _tree([-1, 0, 0], torch.tensor([[5, 9, 100]]))
    sets = pred.predict(None, tree)
    want = torch.tensor([[[0, 1], [2, 3], [4, 5]], c, fallback])
    assert torch.equal(sets[0], torch.zeros(3, 3, 8, dtype=torch.bool).scatter_(-1, want, True))


def test_build_token_table_stage_reports_heldout_accuracy(traces, tmp_path):
    cls = stages.get("build_token_table")
    summary = cls(cls.Config(traces=str(traces))).run(tmp_path, StageContext())
    assert 0.0 < summary["test_acc"] <= 1.0 and (tmp_path / "token_table.safetensors").is_file()


def test_evaluate_predictor_through_interface_matches_lookup(target, traces, tmp_path):
    from specmoe.traces.format import TraceReader
    from specmoe.training.trace_eval import evaluate_lookup, evaluate_predictor
    from specmoe_plugins.predictors.token_table.table import TokenTable, build_token_table

    reader = TraceReader(traces)
    build_token_table(reader).save(tmp_path)
    pred = predictors.get("token_table")(path=str(tmp_path))
    pred.setup(target)
    via_tree = evaluate_predictor(pred, reader, "test", chunk=5)
    direct = evaluate_lookup(TokenTable.load(tmp_path).lookup, reader, "test")
    assert via_tree["acc"] == pytest.approx(direct["acc"]) and via_tree["tokens"] == reader.num_tokens("test")


def test_old_traces_evaluate_module_gives_the_moved_names_with_a_warning():
    """``specmoe.traces.evaluate`` moved to ``specmoe.training.trace_eval`` (no traces <-> training loop): the old
    path keeps every name, with a warning naming the new place, until 0.3.0."""
    import importlib

    from specmoe.training import trace_eval

    old = importlib.import_module("specmoe.traces.evaluate")
    assert sorted(dir(old)) == sorted(trace_eval.__all__)
    for name in trace_eval.__all__:
        with pytest.warns(DeprecationWarning, match=rf"specmoe.training.trace_eval.{name}.*removed in specmoe 0.3.0"):
            assert getattr(old, name) is getattr(trace_eval, name)
    with pytest.raises(AttributeError, match="deprecated alias"):
        old.not_a_name  # noqa: B018
