# SPDX-License-Identifier: Apache-2.0
"""Bad input at the public decoding entry points ends in one clear error naming the argument, the row and the
allowed range (``specmoe.decoding.inputs``), on the tiny GPT-OSS and DeepSeek-V3 targets with every drafter;
valid input still decodes exactly as AR."""

from __future__ import annotations

import re

import pytest
import torch
from fixtures.tiny import random_prompts

from specmoe.decoding.ar import ar_generate
from specmoe.decoding.engine import SelectorError, SpeculativeEngine
from specmoe.decoding.inputs import InputError
from specmoe.decoding.stopping import StopRule
from specmoe.errors import UserError
from specmoe.registry import drafters, predictors, selectors

ARCHS = ["gpt_oss", "deepseek_v3"]
#: every registered drafter kind; ``draft_model`` both sharing the target and as a separate one-layer LM
DRAFTERS = ["self_draft", "draft_lm", "eagle3", "gto", "mtp"]
GOOD = dict(budget=4, steps=3, top_k=2, temperature=0.0, seed=0)


@pytest.fixture(scope="module")
def engines(make_target, make_predictable, agreeing_drafts):
    """``engines(arch, drafter)`` -> a :class:`SpeculativeEngine` (ecospec, so the predictor and the buffer
    apply), built once per module."""
    built = {}

    def get(arch: str, kind: str) -> SpeculativeEngine:
        if (arch, kind) not in built:
            if kind == "self_draft":
                target = make_target(arch)
                drafter = drafters.get("draft_model")(share_target=True)
            else:
                target = make_predictable(arch)[0]
                folder = {"draft_lm": "draft_lm", "eagle3": "eagle3", "gto": "eagle3", "mtp": "mtp_dense"}[kind]
                name = "draft_model" if kind == "draft_lm" else kind
                drafter = drafters.get(name)(path=str(agreeing_drafts(arch, folder)))
            drafter.setup(target)
            pred = predictors.get("router_on_embedding")()
            pred.setup(target)
            built[arch, kind] = SpeculativeEngine(target, drafter, selectors.get("ecospec")(), pred)
        return built[arch, kind]

    return get


def _bad_cases(vocab: int, layers: int, experts: int) -> dict[str, tuple[dict, str]]:
    """name -> (the generate arguments that differ from a good call, a regex the message must match)."""
    v = str(vocab)
    return {
        "empty_prompt": ({"prompts": [[]]}, r"prompts: row 0 is empty: every prompt needs at least 1 token id in "
                                            rf"\[0, {v}\)"),
        "empty_prompt_in_batch": ({"prompts": [[1, 2, 3], [4, 5], []]}, r"prompts: row 2 is empty"),
        "no_rows": ({"prompts": []}, r"prompts is empty: give at least one row"),
        "id_too_large": ({"prompts": [[1, 2], [3, vocab, 4]]},
                         rf"prompts: row 1, position 1 holds token id {v}, outside the target's vocabulary: ids must "
                         rf"be in \[0, {v}\)"),
        "id_negative": ({"prompts": [[-1, 2]]}, rf"row 0, position 0 holds token id -1.*\[0, {v}\)"),
        "ids_outside_counted": ({"prompts": [[1, vocab + 5], [vocab + 9]]},
                                r"row 0, position 1 holds token id .*\(2 ids outside it in all\)"),
        "float_id": ({"prompts": [[1, 2.5]]}, r"row 0, position 1 holds 2.5 \(float\), not an integer token id"),
        "text_prompt": ({"prompts": ["2 + 2 ="]}, r"prompts: row 0 is text \(str\); pass token ids"),
        "flat_prompt": ({"prompts": [1, 2, 3]}, r"prompts: row 0 is int 1, not a sequence of token ids.*\[ids\]"),
        "float_tensor": ({"prompts": torch.ones(2, 3)}, r"prompts as a tensor must be 2-D \[rows, tokens\] of "
                                                       r"integer token ids; got \(2, 3\) torch.float32"),
        "budget_zero": ({"budget": 0}, r"budget \(γ: tree nodes verified per row and step, root included\) must be "
                                       r"an integer >= 1; got 0"),
        "budget_negative": ({"budget": -3}, r"budget .* must be an integer >= 1; got -3"),
        "budget_float": ({"budget": 2.0}, r"budget .* must be an integer >= 1; got 2.0 \(float\)"),
        "steps_zero": ({"steps": 0}, r"steps \(draft tree depth\) must be an integer >= 1; got 0"),
        "top_k_zero": ({"top_k": 0}, rf"top_k \(children per expanded draft node\) must be an integer in "
                                     rf"\[1, {v}\] \(the target's vocab_size\); got 0"),
        "top_k_above_vocab": ({"top_k": vocab + 1}, rf"top_k .* in \[1, {v}\].*got {vocab + 1}"),
        "temperature_negative": ({"temperature": -0.5}, r"temperature must be a finite number >= 0 \(0 = greedy\); "
                                                        r"got -0.5"),
        "temperature_nan": ({"temperature": float("nan")}, r"temperature must be a finite number >= 0.*nan"),
        "stop_not_a_rule": ({"stop": 16}, r"stop must be a StopRule \(e.g. StopRule\(max_new_tokens=128\)\); got int"),
        "seed_not_int": ({"seed": "0"}, r"seed must be an integer; got '0' \(str\)"),
        "buffer_wrong_shape": ({"buffer": torch.zeros(layers + 1, experts, dtype=torch.bool)},
                               rf"buffer \(the initial expert buffer B0\) must be a bool tensor "
                               rf"\[MoE layers, experts\] = \[{layers}, {experts}\] for this target, or None; "
                               rf"got \({layers + 1}, {experts}\)"),
        "buffer_wrong_dtype": ({"buffer": torch.zeros(layers, experts)}, r"buffer .* got .* torch.float32"),
    }


CASES = list(_bad_cases(256, 1, 1))


def _check_raised(excinfo, pattern: str) -> None:
    err = excinfo.value
    assert isinstance(err, ValueError) and isinstance(err, UserError), type(err)
    assert not isinstance(err, SelectorError)
    assert re.search(pattern, str(err)), f"{str(err)!r} does not match {pattern!r}"


@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES)
def test_generate_rejects(engines, arch, kind, case):
    engine = engines(arch, kind)
    t = engine.target
    args, pattern = _bad_cases(t.vocab_size, t.num_moe_layers, t.num_experts)[case]
    call = {"prompts": [[1, 2, 3]], "stop": StopRule(8), **GOOD, **args}
    with pytest.raises(InputError) as excinfo:
        engine.generate(call.pop("prompts"), **call)
    _check_raised(excinfo, pattern)


AR_CASES = [c for c in CASES if not c.startswith(("budget", "steps", "top_k", "buffer"))]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", AR_CASES)
def test_ar_generate_rejects(make_target, arch, case):
    target = make_target(arch)
    args, pattern = _bad_cases(target.vocab_size, target.num_moe_layers, target.num_experts)[case]
    call = {"prompts": [[1, 2, 3]], "stop": StopRule(8), "temperature": 0.0, "seed": 0, **args}
    with pytest.raises(InputError) as excinfo:
        ar_generate(target, call.pop("prompts"), **call)
    _check_raised(excinfo, pattern)


def test_max_new_tokens_must_be_positive(make_target):
    """``StopRule`` refuses a non-positive length itself; one changed afterwards is refused at the call."""
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        StopRule(0)
    stop = StopRule(4)
    stop.max_new_tokens = 0
    with pytest.raises(InputError, match=r"stop.max_new_tokens \(tokens generated per row at most\) must be an "
                                         r"integer >= 1; got 0"):
        ar_generate(make_target("gpt_oss"), [[1, 2]], temperature=0.0, stop=stop)


@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("arch", ARCHS)
def test_valid_input_still_lossless(engines, arch, kind):
    """The accepted forms (lists, tuples, numpy-like integer scalars as 0-d tensors, a 2-D tensor of equal-length
    rows, the buffer in its right shape) decode exactly as AR, with draft tokens accepted."""
    engine = engines(arch, kind)
    t = engine.target
    prompts = random_prompts(3, [2, 9, 17], t.vocab_size, seed=7)
    prompts[1] = tuple(prompts[1])
    prompts[2] = [torch.tensor(x) for x in prompts[2]]
    stop = StopRule(12)
    ref = ar_generate(t, prompts, temperature=0.0, stop=stop)
    assert ref.tokens == [ar_generate(t, [list(map(int, p))], temperature=0.0, stop=stop).tokens[0]
                          for p in prompts]
    buffer = torch.zeros(t.num_moe_layers, t.num_experts, dtype=torch.bool, device=t.device)
    out = engine.generate(prompts, stop=stop, buffer=buffer, **GOOD)
    assert out.tokens == ref.tokens
    square = torch.tensor(random_prompts(2, [6], t.vocab_size, seed=8))
    assert engine.generate(square, stop=stop, **GOOD).tokens == ar_generate(t, square, temperature=0.0,
                                                                              stop=stop).tokens
    if kind != "self_draft":  # the predictable target's drafts agree with it: the tree path is what is compared
        assert any(a >= 2 for s in out.steps for a in s.accepted), f"{arch} {kind}: no draft token accepted"


# ---------------------------------------------------------------------- the Target / Drafter calls of plugins
def _target_cases(b: int, n: int) -> dict[str, tuple]:
    """name -> (forward arguments after input_ids, a regex the message must match), for ``input_ids [b, n]``."""
    pos = torch.arange(n).expand(b, n)
    ok = torch.ones(b, n, dtype=torch.bool)
    return {
        "kv_rows": (lambda t: (t.new_kv(b + 1), pos), rf"kv holds {b + 1} rows but input_ids has B = {b} .*"
                                                     rf"target.new_kv\({b}\)"),
        "positions_rows": (lambda t: (t.new_kv(b), torch.arange(n).expand(b + 1, n)),
                           rf"positions is \({b + 1}, {n}\) torch.int64; expected \[B, N\] = \[{b}, {n}\] int"),
        "positions_float": (lambda t: (t.new_kv(b), pos.float()), r"positions is .* torch.float32; expected .* int"),
        "valid_length": (lambda t: (t.new_kv(b), pos, None, torch.ones(b, n + 1, dtype=torch.bool)),
                         rf"valid is \({b}, {n + 1}\) torch.bool; expected \[B, N\] = \[{b}, {n}\] bool"),
        "attend_not_bool": (lambda t: (t.new_kv(b), pos, torch.ones(b, n, n, dtype=torch.long), ok),
                            rf"attend is \({b}, {n}, {n}\) torch.int64; expected \[B, N, N\] = \[{b}, {n}, {n}\] "
                            r"bool"),
    }


@pytest.mark.parametrize("case", list(_target_cases(1, 1)))
@pytest.mark.parametrize("arch", ARCHS)
def test_target_forward_rejects_mismatched_inputs(make_target, arch, case):
    target = make_target(arch)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    make_args, pattern = _target_cases(2, 3)[case]
    with pytest.raises(ValueError, match=rf"^HFTarget.forward: {pattern}"):
        target.forward(ids, *make_args(target))


@pytest.mark.parametrize("arch", ARCHS)
def test_target_calls_reject_bad_tokens_and_sizes(make_target, arch):
    target = make_target(arch)
    kv = target.new_kv(2)
    with pytest.raises(ValueError, match=r"forward: input_ids is \(2, 0\): it needs B >= 1 rows and N >= 1 tokens"):
        target.forward(torch.zeros(2, 0, dtype=torch.long), kv, torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"forward: input_ids must be a \[B, N\] int64 tensor of token ids; got "
                                         r"\(3,\) torch.int64"):
        target.forward(torch.tensor([1, 2, 3]), kv, torch.arange(3)[None])
    with pytest.raises(ValueError, match=r"forward_standard: attention_mask must be \[B, S \+ N\] = \[2, >= 3\]"):
        target.forward_standard(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 2, dtype=torch.long),
                                torch.arange(3)[None])
    with pytest.raises(ValueError, match=r"forward_standard: positions is \(2, 4\) torch.int64; expected \[B, N\] = "
                                         r"\[2, 3\] \(or \[1, 3\]\) int"):
        target.forward_standard(torch.ones(2, 3, dtype=torch.long), None, torch.arange(4).expand(2, 4))
    for bad in (0, -1, 1.0):
        with pytest.raises(ValueError, match=rf"HFTarget.new_kv: batch_size must be an integer >= 1; got {bad}"):
            target.new_kv(bad)
    with pytest.raises(ValueError, match=r"new_kv: capacity must be an integer >= 0; got -4"):
        target.new_kv(1, capacity=-4)
    # the checks are shapes only: the same calls with right shapes run (one row broadcast in forward_standard)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    out = target.forward(ids, target.new_kv(2), torch.arange(3).expand(2, 3))
    std = target.forward_standard(ids, None, torch.arange(3)[None])
    assert out.logits.shape == std.logits.shape == (2, 3, target.vocab_size)


@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("arch", ARCHS)
def test_drafter_calls_reject_bad_input(engines, arch, kind):
    from specmoe.interfaces.drafter import Committed

    drafter = engines(arch, kind).drafter
    name = type(drafter).__name__
    with pytest.raises(ValueError, match=rf"^{name}.begin: batch_size must be an integer >= 1; got 0"):
        drafter.begin(0)
    state = drafter.begin(2)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    pos = torch.arange(3).expand(2, 3)
    good = Committed(ids, torch.ones(2, 3, dtype=torch.bool), pos, first=True)
    for steps, top_k, bad in ((0, 2, "steps"), (3, 0, "top_k"), (-1, 2, "steps")):
        with pytest.raises(ValueError, match=rf"^{name}.draft: {bad} must be an integer >= 1; got -?\d"):
            drafter.draft(state, good, steps, top_k)
    with pytest.raises(ValueError, match=rf"{name}.draft: committed.valid is \(2, 2\) torch.bool; expected "
                                         r"\[B, M\] = \[2, 3\] bool"):
        drafter.draft(state, Committed(ids, torch.ones(2, 2, dtype=torch.bool), pos, first=True), 3, 2)
    with pytest.raises(ValueError, match=rf"{name}.draft: committed.positions is \(1, 3\) torch.int64; expected "
                                         r"\[B, M\] = \[2, 3\] int"):
        drafter.draft(state, Committed(ids, good.valid, torch.arange(3)[None], first=True), 3, 2)
    with pytest.raises(ValueError, match=rf"{name}.draft: committed must be a Committed \(tokens, valid, positions, "
                                         r"features\); got Tensor"):
        drafter.draft(state, ids, 3, 2)


def test_checks_read_no_device_value(engines):
    """The entry check of a list-of-lists call and the per-call interface checks run no tensor operation and no
    host read (they must not add a sync to a step); a tensor of prompts is read once."""
    from specmoe.bench.opcount import count_ops
    from specmoe.decoding.inputs import check_generate
    from specmoe.interfaces.checks import check_draft, check_forward
    from specmoe.interfaces.drafter import Committed

    engine = engines("gpt_oss", "self_draft")
    t = engine.target
    prompts = random_prompts(4, [40], t.vocab_size, seed=3)
    buffer = torch.zeros(t.num_moe_layers, t.num_experts, dtype=torch.bool)
    ids = torch.tensor(prompts)
    kv = t.new_kv(4)
    pos = torch.arange(40).expand(4, 40)
    ok = torch.ones(4, 40, dtype=torch.bool)
    attend = torch.ones(4, 40, 40, dtype=torch.bool)
    committed = Committed(ids, ok, pos)
    with count_ops() as c:
        check_generate(engine, prompts, budget=4, steps=3, top_k=2, temperature=0.0, stop=StopRule(8), seed=0,
                       buffer=buffer)
        check_forward(t, ids, kv, pos, attend, ok)
        check_draft(engine.drafter, None, committed, 3, 2)
    assert c.total_syncs == 0 and c.total_ops == 0, (c.syncs, c.ops)
    with count_ops() as c:
        check_generate(engine, ids, budget=4, steps=3, top_k=2, temperature=0.0, stop=StopRule(8), seed=0,
                       buffer=None)
    assert c.total_syncs == 1 and c.syncs["tolist"] == 1, c.syncs
