# SPDX-License-Identifier: Apache-2.0
"""Per-node drafter features (``DraftTree.features``): every feature-providing drafter attaches, to every node
of its pool, the state of the draft step that proposed it, and ``Drafter.teacher_features`` computes exactly
the same states teacher-forced over whole sequences (the training data of the ``draft_head`` predictor), at
every depth; ``DraftTree.subset`` carries features along."""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny import random_prompts

from specmoe.interfaces.drafter import Committed
from specmoe.interfaces.tree import DraftTree
from specmoe.registry import drafters

STEPS, TOP_K = 3, 2


def _drafter(kind: str, target, tmp_path):
    if kind == "eagle3":
        d = drafters.get("eagle3")(init={"seed": 3, "draft_vocab_size": 150}, dtype="float32")
    elif kind == "mtp":
        from specmoe_plugins.drafters.mtp.checkpoint import export_head
        from specmoe_plugins.drafters.mtp.model import MTPSpec, build_head

        torch.manual_seed(7)
        head = build_head(target.parts(), MTPSpec(), device="cpu", dtype=torch.float32)
        d = drafters.get("mtp")(path=str(export_head(head, target.parts(), tmp_path / "mtp")))
    elif kind == "small_draft":
        d = drafters.get("draft_model")(tiny={"arch": "qwen3_moe", "seed": 3, "num_hidden_layers": 1},
                                        cache_dir=str(tmp_path))
    else:
        d = drafters.get("draft_model")(share_target=True)
    d.setup(target)
    return d


def _committed(target, drafter, seq: list[int], lo: int, hi: int, first: bool) -> Committed:
    ids = torch.tensor([seq])
    feats = None
    if drafter.feature_layers:
        out = target.forward_standard(ids, torch.ones_like(ids), torch.arange(len(seq))[None],
                                      hidden_layers=drafter.feature_layers, compute_logits=False)
        feats = torch.zeros(1, len(seq), out.hidden.shape[-1])
        feats[:, 1:] = out.hidden[:, :-1]
        feats = feats[:, lo:hi]
    return Committed(ids[:, lo:hi], torch.ones(1, hi - lo, dtype=torch.bool), torch.arange(lo, hi)[None], feats,
                     first)


def _teacher(target, drafter, seq: list[int], depths: int) -> list[torch.Tensor]:
    ids = torch.tensor([seq])
    valid = torch.ones_like(ids, dtype=torch.bool)
    hidden = None
    if drafter.feature_layers:
        hidden = target.forward_standard(ids, valid.long(), torch.arange(len(seq))[None],
                                         hidden_layers=drafter.feature_layers, compute_logits=False).hidden
    return drafter.teacher_features(ids, valid, hidden, depths)


@pytest.mark.parametrize("kind", ["eagle3", "mtp", "small_draft", "self_draft"])
def test_tree_features_equal_teacher_forced_features(make_target, kind, tmp_path):
    target = make_target("qwen3_moe")
    drafter = _drafter(kind, target, tmp_path)
    assert drafter.feature_size > 0
    prompt = random_prompts(1, [13], target.vocab_size, seed=5)[0]
    state = drafter.begin(1)
    # commit in two rounds, the second of one token, so the root's feature comes from the previous round
    drafter.draft(state, _committed(target, drafter, prompt, 0, len(prompt) - 1, True), STEPS, TOP_K)
    tree = drafter.draft(state, _committed(target, drafter, prompt, len(prompt) - 1, len(prompt), False),
                         STEPS, TOP_K)
    assert tree.features is not None and tree.features.shape == (1, tree.num_nodes, drafter.feature_size)
    root_pos = len(prompt) - 1
    # the root: proposed by the step over the committed token before it (depth-1 formula)
    teach = _teacher(target, drafter, prompt, 1)[0]
    torch.testing.assert_close(tree.features[0, 0], teach[0, root_pos], rtol=1e-4, atol=1e-4)
    # every node: along its root-to-node path written out as a sequence, the teacher-forced feature of its
    # depth at its position (the deepest nodes included, although the drafter never consumed them)
    checked = set()
    for path in tree.paths(0):
        seq = prompt + tree.tokens[0, path[1:]].tolist()
        teach = _teacher(target, drafter, seq, STEPS)
        for d, node in enumerate(path[1:], start=1):
            torch.testing.assert_close(tree.features[0, node], teach[d - 1][0, root_pos + d], rtol=1e-4,
                                       atol=1e-4, msg=f"{kind} node {node} depth {d}")
            checked.add(node)
    assert checked == set(range(1, tree.num_nodes))


def test_subset_gathers_features():
    tree = DraftTree.from_lists([5, 6, 7, 8], [-1, 0, 0, 1])
    tree.features = torch.arange(4.0)[None, :, None].expand(1, 4, 3).clone()
    sub = tree.subset(torch.tensor([[0, 1, 3]]), torch.ones(1, 3, dtype=torch.bool))
    assert sub.features[0, :, 0].tolist() == [0.0, 1.0, 3.0]
    assert DraftTree.from_lists([5, 6], [-1, 0]).subset(torch.tensor([[0]]), torch.ones(1, 1, dtype=torch.bool)
                                                        ).features is None
