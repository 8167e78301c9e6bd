# SPDX-License-Identifier: Apache-2.0
"""Routing traces: collection, on-disk format, streaming, 80/20 split by sample, crash-safe resumption."""

from __future__ import annotations

import json

import pytest
import torch

from specmoe.errors import UserError
from specmoe.interfaces.dataset import Sample
from specmoe.traces.format import COLUMNS, TraceReader
from specmoe_plugins.stages.collect_traces.collect import CollectOptions, collect_traces, split_samples

SAMPLES = [Sample(id=f"q{i}", turns=[f"Question {i}: what is {i} plus {3 * i}?"]) for i in range(10)]
OPTS = CollectOptions(max_new_tokens=12, batch_size=4, samples_per_shard=3, progress=False)


@pytest.fixture(scope="module")
def target(make_target):
    return make_target("qwen3_moe")


@pytest.fixture(scope="module")
def traces(target, tmp_path_factory):
    out = tmp_path_factory.mktemp("traces")
    collect_traces(target, SAMPLES, out, OPTS)
    return out


class _Crash(RuntimeError):
    pass


def test_collect_writes_index_shards_and_split(traces):
    r = TraceReader(traces)
    assert r.splits() == {"train": 8, "test": 2}  # 80/20 by sample
    ids = [rec.id for rec in r.samples()]
    assert sorted(ids) == sorted(s.id for s in SAMPLES)  # every sample exactly once
    split = split_samples([s.id for s in SAMPLES], 0.2, 0)  # seeded, over the dataset order
    assert {rec.id for rec in r.samples("test")} == {i for i, s in split.items() if s == "test"}
    for shard in r.shards:  # shards hold one split and at most samples_per_shard samples
        assert shard.file.startswith(shard.split) and 1 <= len(shard.samples) <= 3
    m = r.meta
    assert (m.num_layers, m.num_experts, m.top_k, m.vocab_size) == (3, 8, 2, 256)
    idx = json.loads((traces / "index.json").read_text())
    assert idx["complete"] and idx["format"] == "specmoe-routing-traces"


def test_tokens_are_prompt_plus_own_continuation_and_routing_matches_target(traces, target):
    from specmoe.decoding.ar import ar_generate
    from specmoe.decoding.stopping import StopRule
    from specmoe_plugins.stages.collect_traces.collect import encode_turn

    r = TraceReader(traces)
    for rec, cols in r.iter_samples():
        smp = next(s for s in SAMPLES if s.id == rec.id)
        prompt = encode_turn(None, smp, 0, [], target.vocab_size)
        gen = ar_generate(target, [prompt], temperature=0.0, stop=StopRule(12, target.eos_token_ids),
                          capture_routing=False).tokens[0]
        assert cols["token_ids"].tolist() == prompt + gen
        assert rec.prompt_length == len(prompt)
        assert cols["generated"].tolist() == [i >= len(prompt) for i in range(rec.length)]
        assert cols["positions"].tolist() == list(range(rec.length))
        ids = cols["token_ids"][None]  # the engine's tree-masked forward path, unpadded, as reference
        ref = target.forward(ids, target.new_kv(1), torch.arange(rec.length)[None], capture_routing=True)
        assert torch.equal(ref.routing[0].sort(-1).values, cols["routing"].sort(-1).values)


def test_stored_dtypes_and_streaming(traces):
    from safetensors import safe_open

    r = TraceReader(traces)
    with safe_open(str(traces / r.shards[0].file), framework="pt") as f:
        assert {k: f.get_slice(k).get_dtype() for k in f.keys()} == {
            "token_ids": "I32", "positions": "I32", "sample": "I32", "generated": "BOOL", "routing": "I16"}
    assert set(COLUMNS) == {"token_ids", "positions", "sample", "generated", "routing"}
    streamed = {rec.id: cols for rec, cols in r.iter_samples("train")}
    total = 0
    for shard, cols in r.iter_shards("train"):  # one shard's columns at a time
        assert cols["routing"].shape == (shard.num_tokens, 3, 2)
        for rec in shard.samples:
            sl = slice(rec.offset, rec.offset + rec.length)
            assert torch.equal(cols["token_ids"][sl].long(), streamed[rec.id]["token_ids"])
            assert torch.equal(cols["routing"][sl].long(), streamed[rec.id]["routing"])
            assert torch.equal(cols["sample"][sl], torch.full((rec.length,), shard.samples.index(rec),
                                                                dtype=torch.int32))
        total += shard.num_tokens
    assert total == r.num_tokens("train")
    rec = r.samples("test")[0]
    part = r.read(rec, 2, 5)  # a window is a slice of the shard
    assert torch.equal(part["token_ids"], r.read(rec)["token_ids"][2:5])


def test_split_is_by_sample_seeded_and_complete():
    ids = [f"s{i}" for i in range(50)]
    a, b = split_samples(ids, 0.2, 0), split_samples(ids, 0.2, 0)
    assert a == b and sum(v == "test" for v in a.values()) == 10 and set(a) == set(ids)
    assert split_samples(ids, 0.2, 1) != a


def test_resume_after_crash_mid_shard_has_no_duplicates(target, traces, tmp_path):
    out = tmp_path / "crashed"

    def crash_at_5(n: int) -> None:
        if n == 5:  # shard 0 (3 samples) finished, shard 1 has 2 of its 3 samples in memory
            raise _Crash()

    with pytest.raises(_Crash):
        collect_traces(target, SAMPLES, out, OPTS, on_sample=crash_at_5)
    assert not (out / "index.json").exists()
    assert sorted(p.name for p in out.glob("*.json")) == ["plan.json", "train-00000.json"]
    with pytest.raises(UserError):
        TraceReader(out)
    redone = []
    collect_traces(target, SAMPLES, out, OPTS, on_sample=redone.append)
    assert len(redone) == len(SAMPLES) - 3  # only the unfinished shards were traced again
    fresh, resumed = TraceReader(traces), TraceReader(out)
    assert [r.id for r in resumed.samples()] == [r.id for r in fresh.samples()]
    for (ra, ca), (rb, cb) in zip(fresh.iter_samples(), resumed.iter_samples()):
        assert ra == rb and all(torch.equal(ca[k], cb[k]) for k in COLUMNS)


def test_reopening_with_another_plan_is_refused(target, traces):
    other = CollectOptions(max_new_tokens=5, batch_size=4, samples_per_shard=3, progress=False)
    with pytest.raises(UserError, match="different collection plan"):
        collect_traces(target, SAMPLES, traces, other)


def test_multi_turn_sample_traces_the_whole_conversation(make_target, tmp_path):
    from specmoe_plugins.targets.tiny.tokenizer import train_bpe_tokenizer

    tok = train_bpe_tokenizer(["what is two plus two", "the answer is four"] * 4, vocab_size=280)
    target = make_target("qwen3_moe", vocab_size=288)
    target.tokenizer = tok  # a target with a real tokenizer (the tiny checkpoint has none)
    sample = Sample(id="chat", turns=["what is two plus two", "and four plus four"], chat=True)
    opts = CollectOptions(max_new_tokens=5, test_fraction=0.0, progress=False)
    collect_traces(target, [sample], tmp_path, opts)
    rec, cols = next(TraceReader(tmp_path).iter_samples("train"))
    prompt = tok.decode(cols["token_ids"][:rec.prompt_length])
    # the traced sequence is the last turn: first question, the target's own first answer, second question
    assert prompt.index("two plus two") < prompt.index("four plus four")
    assert 0 < rec.length - rec.prompt_length <= 5
