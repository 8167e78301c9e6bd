# SPDX-License-Identifier: Apache-2.0
"""At T > 0 speculative decoding samples from the target's distribution.

* the rejection rule alone, on hand-built trees with known target probabilities: the emitted first and second
  tokens follow the target distribution (many draws, tight tolerance);
* end to end on a tiny-vocabulary target: a chi-square test of generated 3-token sequences against the exact
  target distribution (enumerated), for speculative decoding and for the autoregressive sampler.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from specmoe.decoding.acceptance import sample_accept
from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SpeculativeEngine
from specmoe.decoding.stopping import StopRule
from specmoe.interfaces.tree import DraftTree
from specmoe.registry import drafters, selectors


def chi2_pvalue(stat: float, dof: int) -> float:
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


def chi2_test(observed: dict, expected_p: dict, n: int) -> tuple[float, float]:
    """Pool cells with expected count < 5 into one bin; return (statistic, p-value)."""
    stat, dof, rest_o, rest_e = 0.0, -1, 0.0, 0.0
    for key, p in expected_p.items():
        e = p * n
        o = observed.get(key, 0)
        if e < 5:
            rest_o += o
            rest_e += e
            continue
        stat += (o - e) ** 2 / e
        dof += 1
    if rest_e > 0:
        stat += (rest_o - rest_e) ** 2 / rest_e
        dof += 1
    return stat, chi2_pvalue(stat, max(dof, 1))


@pytest.mark.parametrize("parents,children_tokens", [
    ([-1, 0, 0, 1, 1, 2], [2, 0, 1, 3, 0]),   # two levels, duplicates across branches
    ([-1, 0, 1, 2], [1, 1, 1]),                # a chain of the most likely token
])
def test_rejection_rule_matches_target(parents, children_tokens):
    v = 4
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(len(parents), v, generator=g) * 1.5
    tree = DraftTree.from_lists([0] + children_tokens, parents)
    temp = 0.7
    p_root = torch.softmax(logits[0] / temp, -1)
    n = 40000
    first = torch.zeros(v)
    pair = torch.zeros(v, v)
    gen = torch.Generator().manual_seed(1)
    for _ in range(n):
        acc = sample_accept(tree.tokens[0], tree.parents[0], tree.valid[0], logits, temp, gen)
        emitted = tree.tokens[0, acc.path[1:]].tolist() + [acc.bonus]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            pair[emitted[0], emitted[1]] += 1
    assert torch.allclose(first / n, p_root, atol=4 * (0.25 / n) ** 0.5 + 1e-3), (first / n, p_root)
    # second token given the first, where the first was a draft node (its logits row is known)
    for node in range(1, len(parents)):
        if parents[node] != 0:
            continue
        x = tree.tokens[0, node].item()
        grand = [c for c in range(len(parents)) if parents[c] == node]
        if not grand or first[x] < 2000:
            continue
        cond = pair[x] / pair[x].sum()
        ref = torch.softmax(logits[node] / temp, -1)
        assert torch.allclose(cond, ref, atol=0.03), (x, cond, ref)


@pytest.fixture(scope="module")
def small_vocab_target(tiny_cache):
    from specmoe.registry import targets

    return targets.get("hf")(tiny={"arch": "qwen3_moe", "vocab_size": 6, "seed": 11, "initializer_range": 0.08},
                             cache_dir=str(tiny_cache))


def _exact_distribution(target, prompt, horizon):
    probs = {}
    for seq in itertools.product(range(target.vocab_size), repeat=horizon):
        with torch.no_grad():
            logits = target.model(input_ids=torch.tensor([prompt + list(seq)])).logits[0].float()
        p = 1.0
        for i, tok in enumerate(seq):
            p *= float(torch.softmax(logits[len(prompt) - 1 + i], -1)[tok])
        probs[seq] = p
    return probs


#: goodput with fixed costs (the engine does not feed its models yet). Its decision is joint over the 500 rows
#: of a batch, so extra tokens must be cheap against the fixed cost for it to verify trees at all
GOODPUT = {"coefficients": {"fixed": 5e-3, "tokens": 1e-6, "expert_layers": 1e-6}}


@pytest.mark.parametrize("selector,predictor", [("confidence", "router_on_embedding"),
                                                ("ecospec", "router_on_embedding"), ("goodput", "router_on_embedding"),
                                                ("ecospec", "draft_head")])
def test_speculative_sampling_chi_square(small_vocab_target, selector, predictor, tmp_path):
    from specmoe.registry import predictors

    target = small_vocab_target
    prompt, horizon, rows, reps = [1, 4, 2], 3, 500, 8
    exact = _exact_distribution(target, prompt, horizon)
    drafter = drafters.get("draft_model")(tiny={"arch": "qwen3_moe", "seed": 5, "num_hidden_layers": 1,
                                                "vocab_size": 6}, cache_dir=str(tmp_path))
    drafter.setup(target)
    pred = predictors.get(predictor)(**({"init": {"seed": 0, "rank": 8}} if predictor == "draft_head" else {}))
    pred.setup(target)
    engine = SpeculativeEngine(target, drafter, selectors.get(selector)(**(GOODPUT if selector == "goodput" else {})),
                               pred)
    counts: dict = {}
    multi = 0
    for r in range(reps):
        out = engine.generate([prompt] * rows, budget=4, steps=3, top_k=2, temperature=1.0,
                              stop=StopRule(horizon), seed=100 + r)
        multi += sum(a > 1 for s in out.steps for a in s.accepted)
        for t in out.tokens:
            counts[tuple(t)] = counts.get(tuple(t), 0) + 1
    n = rows * reps
    stat, p = chi2_test(counts, exact, n)
    assert multi > 0, "some steps must accept draft tokens"
    assert p > 1e-3, f"chi2={stat:.1f} p={p:.2e}: SD samples do not follow the target distribution"


def test_ar_sampling_chi_square(small_vocab_target):
    target = small_vocab_target
    prompt, horizon = [1, 4, 2], 3
    exact = _exact_distribution(target, prompt, horizon)
    counts: dict = {}
    n = 0
    for r in range(8):
        out = ar_generate(target, [prompt] * 500, temperature=1.0, stop=StopRule(horizon), seed=r)
        for t in out.tokens:
            counts[tuple(t)] = counts.get(tuple(t), 0) + 1
            n += 1
    stat, p = chi2_test(counts, exact, n)
    assert p > 1e-3, f"chi2={stat:.1f} p={p:.2e}"


def test_chi_square_detects_a_wrong_distribution(small_vocab_target):
    """The test above can fail: a biased sampler (T = 0.5 instead of 1) is rejected."""
    target = small_vocab_target
    prompt, horizon = [1, 4, 2], 3
    exact = _exact_distribution(target, prompt, horizon)
    counts: dict = {}
    for r in range(8):
        out = ar_generate(target, [prompt] * 500, temperature=0.5, stop=StopRule(horizon), seed=r)
        for t in out.tokens:
            counts[tuple(t)] = counts.get(tuple(t), 0) + 1
    _, p = chi2_test(counts, exact, 4000)
    assert p < 1e-3
