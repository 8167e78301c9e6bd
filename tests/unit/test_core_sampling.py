# SPDX-License-Identifier: Apache-2.0
"""At T > 0 speculative decoding samples from the target's distribution.

* the rejection rule alone, on hand-built trees with known target probabilities (one with two sibling nodes of
  the same token): a chi-square test of the first two emitted tokens against their exact law; and the same test
  at the same sample size rejects three subtly wrong variants of the rule (built here, never in the package),
  so it has the power to catch more than a gross mistake;
* end to end on a tiny-vocabulary target: a chi-square test of generated 3-token sequences against the exact
  target distribution (enumerated), for speculative decoding and for the autoregressive sampler.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from specmoe.decoding.acceptance import Acceptance, sample_accept, target_probs
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


# ---------------------------------------------------------------- the rejection rule on hand-built trees
#: (parents, child tokens) of hand-built trees over a 4-token vocabulary (the root's token is 0)
TREES = {
    "two_levels": ([-1, 0, 0, 1, 1, 2], [2, 0, 1, 3, 0]),            # duplicates across branches
    "chain": ([-1, 0, 1, 2], [1, 1, 1]),                             # a chain of one token
    "duplicate_siblings": ([-1, 0, 0, 0, 1, 1, 3], [1, 1, 3, 2, 0, 1]),  # nodes 1 and 2: token 1 twice
}
TEMPERATURE = 0.7
#: draws per chi-square test of the rule (and of its mistaken variants: the same sample size and seed)
N_DRAWS = 20000


def _tree_case(name: str) -> tuple[DraftTree, torch.Tensor]:
    """The tree and its target logits ``[N, 4]``; twin siblings (same parent, same token) share their row, as
    they do in a real verification pass (same context, same token)."""
    parents, children = TREES[name]
    tree = DraftTree.from_lists([0] + children, parents)
    logits = torch.randn(len(parents), 4, generator=torch.Generator().manual_seed(0)) * 1.5
    toks = tree.tokens[0].tolist()
    for i in range(1, len(parents)):
        twin = next((j for j in range(1, i) if parents[j] == parents[i] and toks[j] == toks[i]), None)
        if twin is not None:
            logits[i] = logits[twin]
    return tree, logits


def _exact_two_tokens(tree: DraftTree, logits: torch.Tensor) -> dict:
    """Exact law of ``(first emitted token, second emitted token or None)`` of one step: the first is
    softmax(root / T); a child token can only be emitted by accepting that child (a rejected token gets
    probability 0), so the second then follows the child's own softmax; any other first token is the bonus
    and ends the step."""
    toks, par = tree.tokens[0].tolist(), tree.parents[0].tolist()
    first_child = {}
    for c in range(1, len(par)):
        if par[c] == 0:
            first_child.setdefault(toks[c], c)
    p_root = target_probs(logits[0], TEMPERATURE)
    out: dict = {}
    for a in range(logits.shape[1]):
        if a in first_child:
            p_next = target_probs(logits[first_child[a]], TEMPERATURE)
            out.update({(a, b): float(p_root[a] * p_next[b]) for b in range(logits.shape[1])})
        else:
            out[(a, None)] = float(p_root[a])
    return out


def _draw_two_tokens(accept_fn, tree: DraftTree, logits: torch.Tensor, n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    counts: dict = {}
    for _ in range(n):
        acc = accept_fn(tree.tokens[0], tree.parents[0], tree.valid[0], logits, TEMPERATURE, g)
        emitted = tree.tokens[0, acc.path[1:]].tolist() + [acc.bonus]
        key = (emitted[0], emitted[1] if len(acc.path) > 1 else None)
        counts[key] = counts.get(key, 0) + 1
    return counts


def _total_variation(counts: dict, exact: dict, n: int) -> float:
    return 0.5 * sum(abs(counts.get(k, 0) / n - exact.get(k, 0.0)) for k in set(counts) | set(exact))


@pytest.mark.parametrize("case", list(TREES))
def test_rejection_rule_matches_target(case):
    """The package's rule: chi-square of the first two emitted tokens against their exact law."""
    tree, logits = _tree_case(case)
    exact = _exact_two_tokens(tree, logits)
    n = N_DRAWS
    counts = _draw_two_tokens(sample_accept, tree, logits, n, seed=1)
    stat, p = chi2_test(counts, exact, n)
    assert p > 1e-3, f"{case}: chi2={stat:.1f} p={p:.2e} (total variation {_total_variation(counts, exact, n):.3f})"


def _mistaken_accept(mistake: str):
    """A deliberately wrong variant of the rejection rule (never in the package), for the power test below.

    * ``no_renormalise``: after a rejection ``p(x) := 0`` but the residual is not renormalised, so the next
      sibling is accepted with ``p(y)`` instead of ``p(y) / (1 - p(x))``.
    * ``twin_second_chance``: a sibling whose token its twin already had is tested with the probability of
      that twin (the wrong sibling's probability, before the rejection) instead of the residual's 0.
    * ``temperature_twice``: the acceptance test uses the tempered logits tempered again
      (``softmax(z / T**2)``); the residual and the bonus use the right ``softmax(z / T)``. (The draft's own
      probabilities never enter this rule -- deterministic top-k drafts, q = 1 -- so a temperature misapplied
      to the draft cannot change the output law; applying it twice to the target can.)
    """

    def accept_fn(tokens, parents, valid, logits, temperature, generator):
        toks, par, ok = tokens.tolist(), parents.tolist(), valid.tolist()
        kids = [[c for c in range(len(par)) if par[c] == node and ok[c]] for node in range(len(par))]
        path = [0]
        while True:
            node = path[-1]
            p = target_probs(logits[node], temperature)
            p_test = target_probs(logits[node] / temperature, temperature) if mistake == "temperature_twice" else p
            tried: dict[int, float] = {}
            moved = False
            for c in kids[node]:
                x = toks[c]
                px = tried[x] if mistake == "twin_second_chance" and x in tried else float(p_test[x])
                if float(torch.rand((), generator=generator)) < px:
                    path.append(c)
                    moved = True
                    break
                tried[x] = px
                p, p_test = p.clone(), p_test.clone()
                p[x] = p_test[x] = 0.0
                if mistake != "no_renormalise":
                    p, p_test = p / p.sum(), p_test / p_test.sum()
            if not moved:
                return Acceptance(path, int(torch.multinomial(p, 1, generator=generator)))

    return accept_fn


@pytest.mark.parametrize("mistake", ["no_renormalise", "twin_second_chance", "temperature_twice"])
def test_chi_square_rejects_subtle_mistakes(mistake):
    """Power: on the duplicate-sibling tree, the sample size and seed of the test above reject each mistaken
    rule at p < 1e-6 although its output law is within 0.1 total variation of the target's (measured: p <= 1e-10
    for each mistake over seeds 1-6, total variation 0.03-0.09; the correct rule: p = 0.77)."""
    tree, logits = _tree_case("duplicate_siblings")
    exact = _exact_two_tokens(tree, logits)
    n = N_DRAWS
    counts = _draw_two_tokens(_mistaken_accept(mistake), tree, logits, n, seed=1)
    stat, p = chi2_test(counts, exact, n)
    tv = _total_variation(counts, exact, n)
    assert tv < 0.1, f"{mistake} is not a subtle mistake here (total variation {tv:.3f})"
    assert p < 1e-6, f"{mistake}: chi2={stat:.1f} p={p:.2e}: the test has no power against it"


def test_duplicate_twin_is_never_accepted():
    """On the duplicate-sibling tree the rule only ever accepts the first of two twins (the second's token
    has probability 0 once its twin is rejected), and it does accept the first."""
    tree, logits = _tree_case("duplicate_siblings")
    g = torch.Generator().manual_seed(2)
    firsts = [sample_accept(tree.tokens[0], tree.parents[0], tree.valid[0], logits, TEMPERATURE, g).path[1:2]
              for _ in range(3000)]
    assert [1] in firsts and [2] not in firsts


@pytest.fixture(scope="module")
def small_vocab_target(tiny_cache):
    from specmoe.registry import targets

    torch.set_num_threads(1)
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


#: goodput with fixed costs (no online refit, no AR floor). Its decision is joint over the 500 rows of a batch, so
#: extra tokens must be cheap against the fixed cost for it to verify trees at all
GOODPUT = {"coefficients": {"fixed": 5e-3, "tokens": 1e-6, "expert_layers": 1e-6}, "online": False,
           "ar_floor": False}
#: goodput learning online under an AR floor forced to fall back after every speculative step (wait 1, then 2
#: steps): generations mix AR and speculative steps, and a generation may start with AR steps (the floor's
#: state carries over from the previous generation)
OPTIONS = {"goodput": GOODPUT, "goodput_floor": {**GOODPUT, "online": True, "ar_floor": True, "floor_margin": 1e9,
                                                 "probe_after": 1, "probe_max": 2, "floor_tolerance": 0.0}}


@pytest.mark.parametrize("selector,predictor", [("confidence", "router_on_embedding"),
                                                ("ecospec", "router_on_embedding"), ("goodput", "router_on_embedding"),
                                                ("goodput_floor", "router_on_embedding"), ("ecospec", "draft_head")])
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
    engine = SpeculativeEngine(target, drafter, selectors.get(selector.split("_")[0])(**OPTIONS.get(selector, {})),
                               pred)
    counts: dict = {}
    multi = ar_steps = ar_first = 0
    for r in range(reps):
        out = engine.generate([prompt] * rows, budget=4, steps=3, top_k=2, temperature=1.0,
                              stop=StopRule(horizon), seed=100 + r)
        multi += sum(a > 1 for s in out.steps for a in s.accepted)
        ar_steps += sum(not s.speculative for s in out.steps)
        ar_first += not out.steps[0].speculative
        for t in out.tokens:
            counts[tuple(t)] = counts.get(tuple(t), 0) + 1
    n = rows * reps
    stat, p = chi2_test(counts, exact, n)
    assert multi > 0, "some steps must accept draft tokens"
    assert (ar_steps > 0) == (ar_first > 0) == (selector == "goodput_floor"), (ar_steps, ar_first)
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
