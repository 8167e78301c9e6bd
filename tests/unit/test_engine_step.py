# SPDX-License-Identifier: Apache-2.0
"""The engine's step machinery: trees carry their ancestor matrix, batched greedy acceptance equals the
sequential walk, the verification pass and the engine's own glue do not read device values on the host beyond
the two reads per step (selection, acceptance), logits are computed only where asked, and the grouped attention
equals eager attention."""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny import random_prompts

from specmoe.decoding.acceptance import greedy_accept, greedy_paths
from specmoe.interfaces.tree import DraftTree, ancestor_matrix


def _loop_ancestors(parents: torch.Tensor) -> torch.Tensor:
    b, n = parents.shape
    anc = torch.eye(n, dtype=torch.bool).expand(b, n, n).clone()
    for i in range(1, n):
        p = parents[:, i]
        anc[:, i] |= anc[torch.arange(b), p.clamp(min=0)] & (p >= 0)[:, None]
    return anc


def _random_parents(n: int, g: torch.Generator) -> list[int]:
    return [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]


def test_ancestor_matrix_equals_the_sequential_definition():
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 7, 11, 33):
        parents = torch.tensor([_random_parents(n, g) for _ in range(4)])
        assert torch.equal(ancestor_matrix(parents), _loop_ancestors(parents))


def test_pool_carries_its_ancestors_and_subset_gathers_them():
    from specmoe.decoding.tree_builder import build_pool

    g = torch.Generator().manual_seed(1)
    v = 50
    tree = build_pool(torch.tensor([3, 4]), torch.log_softmax(torch.randn(2, v, generator=g), -1),
                      lambda tok, idx, anc: torch.log_softmax(torch.randn(*tok.shape, v, generator=g), -1), 3, 2)
    assert tree.anc is not None and torch.equal(tree.anc, ancestor_matrix(tree.parents))
    sel = torch.zeros_like(tree.valid)
    sel[0, [0, 1, 3, 4]] = True
    sel[1, [0, 2]] = True
    counts = sel.sum(1)
    order = torch.argsort((~sel).to(torch.int8), dim=1, stable=True)[:, :4]
    sub = tree.subset(order, torch.arange(4)[None] < counts[:, None])
    assert torch.equal(sub.anc, ancestor_matrix(sub.parents))


def test_batched_greedy_acceptance_equals_the_walk():
    g = torch.Generator().manual_seed(2)
    for _ in range(300):
        b, m, v = 3, int(torch.randint(1, 9, (1,), generator=g)), 3  # 3 tokens: many duplicate siblings
        parents = torch.tensor([_random_parents(m, g) for _ in range(b)])
        tokens = torch.randint(0, v, (b, m), generator=g)
        valid = torch.rand(b, m, generator=g) > 0.2
        valid[:, 0] = True
        for i in range(1, m):  # padding is closed downwards, as in a verified subset
            valid[:, i] &= valid.gather(1, parents[:, i:i + 1].clamp(min=0))[:, 0]
        logits = torch.randn(b, m, v, generator=g)
        path, bonus = greedy_paths(tokens, parents, valid, ancestor_matrix(parents), logits)
        for r in range(b):
            ref = greedy_accept(tokens[r], parents[r], valid[r], logits[r])
            assert path[r].nonzero().squeeze(1).tolist() == ref.path and int(bonus[r]) == ref.bonus


def test_logits_only_where_asked(make_target, arch):
    target = make_target(arch)
    ids = torch.tensor(random_prompts(2, [9], target.vocab_size, seed=3))
    pos = torch.arange(9).expand(2, 9)
    full = target.forward(ids, target.new_kv(2), pos).logits
    at = torch.tensor([[8], [4]])
    part = target.forward(ids, target.new_kv(2), pos, logits_at=at).logits
    assert part.shape == (2, 1, target.vocab_size)
    assert torch.allclose(part[:, 0], full[[0, 1], [8, 4]], atol=1e-5)
    mask = torch.ones_like(ids)
    std = target.forward_standard(ids, mask, pos, target.new_standard_cache(), logits_to_keep=1).logits
    assert std.shape == (2, 1, target.vocab_size) and torch.allclose(std[:, 0], full[:, -1], atol=1e-4)


def test_engine_step_reads_the_device_twice(make_target):
    """Per step at T = 0: the verification pass reads no device values on the host but, on a CPU, the union
    experts loop's per-expert slot counts (one read per MoE layer, free where host and device are one; GPUs take
    grouped_mm, which reads nothing), and the engine's glue (everything but the drafter, predictor and selector)
    reads twice: the selection, the acceptance (the node values the selector ranks by count as the selection's:
    a small CPU pool reads them on the host, where that is free)."""
    from specmoe.decoding.engine import SpeculativeEngine
    from specmoe.registry import drafters, predictors, selectors
    from specmoe_plugins.benches.engine.bench import count_step_ops

    target = make_target("gpt_oss")
    drafter = drafters.get("eagle3")(init={"seed": 1, "draft_vocab_size": 200})
    drafter.setup(target)
    pred = predictors.get("router_on_embedding")()
    pred.setup(target)
    engine = SpeculativeEngine(target, drafter, selectors.get("ecospec")(), pred)
    prompt = random_prompts(1, [20], target.vocab_size, seed=4)[0]
    counts = count_step_ops(engine, prompt, 12, 4)
    assert counts["steps"] > 3
    assert counts["syncs"]["draft"] == 0
    assert {k for k in counts["sync_kinds"] if k.startswith("verify:")} <= {"verify:tolist"}
    assert counts["syncs"]["verify"] <= target.num_moe_layers
    assert counts["syncs"]["rest"] == pytest.approx(2.0)
    assert counts["ops"]["verify"] > 0


@pytest.mark.parametrize("rep", [1, 2, 4])
@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("mask_kind", ["float", "bool", "per_head"])
def test_grouped_attention_equals_eager(rep, sinks, mask_kind):
    import transformers.models.gpt_oss.modeling_gpt_oss as gpt_oss
    import transformers.models.qwen3_moe.modeling_qwen3_moe as qwen3

    from specmoe_plugins.targets.hf.attention import grouped_attention

    g = torch.Generator().manual_seed(rep)
    b, hkv, n, s, d = 2, 2, 3, 13, 8
    hq = hkv * rep
    module = torch.nn.Module()
    module.num_key_value_groups = rep
    if sinks:
        module.sinks = torch.nn.Parameter(torch.randn(hq, generator=g))
    q = torch.randn(b, n, hq, d, generator=g).transpose(1, 2)
    k = torch.randn(b, hkv, s + 5, d, generator=g)[:, :, :s]  # a view of a longer buffer, as the cache gives
    v = torch.randn(b, hkv, s + 5, d, generator=g)[:, :, :s]
    allowed = torch.rand(b, hq if mask_kind == "per_head" else 1, n, s, generator=g) > 0.3
    allowed[..., 0] = True
    additive = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
    ref_fn = (gpt_oss if sinks else qwen3).eager_attention_forward
    module.training = False
    ref, _ = ref_fn(module, q, k, v, additive, scaling=d ** -0.5, dropout=0.0)
    got, _ = grouped_attention(module, q, k, v, allowed if mask_kind == "bool" else additive, scaling=d ** -0.5)
    assert got.shape == ref.shape and torch.allclose(got, ref, atol=1e-6), (got - ref).abs().max()


def test_targets_use_grouped_attention_and_match_eager(make_target, arch, tiny_cache):
    from specmoe.registry import targets

    target = make_target(arch)
    assert target.model.config._attn_implementation == "specmoe_gqa"
    eager = targets.get("hf")(tiny={"arch": arch}, cache_dir=str(tiny_cache), attn_implementation="eager")
    ids = torch.tensor(random_prompts(2, [21], target.vocab_size, seed=5))
    with torch.no_grad():
        a, b = target.model(input_ids=ids).logits, eager.model(input_ids=ids).logits
    assert torch.allclose(a, b, atol=2e-5), (a - b).abs().max()


def test_draft_tree_from_lists_keeps_working_without_a_matrix():
    tree = DraftTree.from_lists([1, 2, 3], [-1, 0, 1])
    assert tree.anc is None and tree.ancestors().tolist() == [[[True, False, False], [True, True, False],
                                                              [True, True, True]]]
