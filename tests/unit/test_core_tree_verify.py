# SPDX-License-Identifier: Apache-2.0
"""One tree pass gives the same logits as running each root-to-node path sequentially; pruning the KV cache
to an accepted path and decoding further equals plain decoding of that sequence."""

from __future__ import annotations

import torch
from fixtures.tiny import random_prompts

from specmoe.interfaces.tree import DraftTree


def _plain_logits(target, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return target.model(input_ids=torch.tensor([ids])).logits[0].float()


def _tree(vocab: int) -> DraftTree:
    # root, two children, grandchildren on both, one great-grandchild
    parents = [-1, 0, 0, 1, 1, 2, 3]
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, vocab, (len(parents),), generator=g).tolist()
    return DraftTree.from_lists(tokens, parents, [1.0, .5, .4, .3, .2, .1, .05])


def test_tree_logits_equal_sequential(make_target, arch):
    target = make_target(arch)
    prefix = random_prompts(1, [19], target.vocab_size, seed=2)[0]  # > GPT-OSS window of 8
    kv = target.new_kv(1)
    n = len(prefix)
    target.forward(torch.tensor([prefix]), kv, torch.arange(n)[None])
    tree = _tree(target.vocab_size)
    out = target.forward(tree.tokens, kv, n + tree.depth, tree.ancestors(), tree.valid)
    for path in tree.paths(0):
        seq = prefix + tree.tokens[0, path].tolist()
        ref = _plain_logits(target, seq)[n:]
        got = out.logits[0, path]
        assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4), (arch, path, (got - ref).abs().max())


def test_prune_then_decode_equals_plain(make_target, arch):
    target = make_target(arch)
    prefix = random_prompts(1, [17], target.vocab_size, seed=4)[0]
    kv = target.new_kv(1)
    n = len(prefix)
    target.forward(torch.tensor([prefix]), kv, torch.arange(n)[None])
    tree = _tree(target.vocab_size)
    target.forward(tree.tokens, kv, n + tree.depth, tree.ancestors(), tree.valid)
    path = [0, 2, 5]  # a non-contiguous accepted path: forces a gather, not a crop
    keep = torch.zeros(1, tree.num_nodes, dtype=torch.bool)
    keep[0, path] = True
    kv.keep_last(tree.num_nodes, keep)
    assert kv.num_slots == n + len(path)
    seq = prefix + tree.tokens[0, path].tolist()
    nxt = [7, 11, 13]
    out = target.forward(torch.tensor([nxt]), kv, torch.arange(len(seq), len(seq) + 3)[None])
    ref = _plain_logits(target, seq + nxt)[len(seq):]
    assert torch.allclose(out.logits[0], ref, atol=1e-4, rtol=1e-4), (out.logits[0] - ref).abs().max()


def test_batched_rows_with_padding_keep_their_own_context(make_target):
    target = make_target("gpt_oss")
    p = random_prompts(2, [5, 14], target.vocab_size, seed=6)
    from specmoe.decoding.engine import pad_rows

    ids, valid = pad_rows(p, torch.device("cpu"))
    kv = target.new_kv(2)
    m = ids.shape[1]
    out = target.forward(ids, kv, torch.arange(m).expand(2, m), None, valid)
    for b in range(2):
        ref = _plain_logits(target, p[b])
        assert torch.allclose(out.logits[b, :len(p[b])], ref, atol=1e-4, rtol=1e-4)
    # keep a different number of tree nodes per row, then decode one token per row
    tree = DraftTree.from_lists([1, 2, 3], [-1, 0, 1])
    tokens = tree.tokens.expand(2, 3)
    pos = kv.next_position()[:, None] + tree.depth
    target.forward(tokens, kv, pos, tree.ancestors().expand(2, 3, 3), torch.ones(2, 3, dtype=torch.bool))
    keep = torch.tensor([[True, False, False], [True, True, True]])
    kv.keep_last(3, keep)
    seqs = [p[0] + [1], p[1] + [1, 2, 3]]
    nxt = torch.tensor([[9], [9]])
    out = target.forward(nxt, kv, kv.next_position()[:, None])
    for b in range(2):
        ref = _plain_logits(target, seqs[b] + [9])[-1]
        assert torch.allclose(out.logits[b, 0], ref, atol=1e-4, rtol=1e-4)
