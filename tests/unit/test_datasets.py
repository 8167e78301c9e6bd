# SPDX-License-Identifier: Apache-2.0
"""Benchmark dataset plugins (paper Appendix E prompts), data sources and prompt rendering."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from specmoe.data import plain_chat_text, render_prompt, render_turn, select_indices
from specmoe.errors import UserError
from specmoe.interfaces.dataset import Sample
from specmoe.registry.kinds import datasets
from specmoe_plugins.datasets.aime25 import AIME25
from specmoe_plugins.datasets.amc import AMC
from specmoe_plugins.datasets.gsm8k import GSM8K
from specmoe_plugins.datasets.humaneval import HumanEval
from specmoe_plugins.datasets.jsonl import JsonlPrompts
from specmoe_plugins.datasets.math500 import MATH500
from specmoe_plugins.datasets.mmstar import MMStar
from specmoe_plugins.datasets.mt_bench import MTBench

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_data = pytest.mark.skipif(not (DATA / "README.md").is_file(), reason=f"benchmark data not at {DATA}")

# counts from shared/data/README.md
COUNTS = {"gsm8k": 1319, "humaneval": 164, "aime25": 30, "math500": 500, "amc": 83, "mt_bench": 80,
          "mmstar": 1500}


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.setenv("SPECMOE_DATA_DIR", str(DATA))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # never touch the network in unit tests


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


# ---------------------------------------------------------------------- loading and prompt formats
@needs_data
@pytest.mark.parametrize("name", sorted(COUNTS))
def test_every_plugin_loads_all_samples(name):
    cls = datasets.get(name)
    samples = cls().load()
    assert len(samples) == COUNTS[name]
    assert len({s.id for s in samples}) == len(samples)
    assert all(s.turns and all(isinstance(t, str) and t for t in s.turns) for s in samples)


@needs_data
def test_gsm8k_five_shot_from_train_then_test_question():
    train = _jsonl(DATA / "gsm8k" / "train.jsonl")
    test = _jsonl(DATA / "gsm8k" / "test.jsonl")
    s = GSM8K(limit=3, seed=None).load()[1]
    prompt = s.turns[0]
    blocks = prompt.split("\n\n")
    assert len(blocks) == 6 and prompt.count("Question: ") == 6
    for i, block in enumerate(blocks[:5]):
        assert block.startswith(f"Question: {train[i]['question']}\nAnswer: ")
        assert block.endswith(f"The answer is {train[i]['answer'].split('####')[1].strip()}.")
        assert "<<" not in block
    assert blocks[5] == f"Question: {test[1]['question']}\nAnswer:"
    assert s.reference == test[1]["answer"].rsplit("####", 1)[1].strip()
    assert s.id == "gsm8k/test/1" and s.chat is False
    with_commas = next(i for i, r in enumerate(test) if "," in r["answer"].rsplit("####", 1)[1])
    assert "," not in GSM8K(format="zeroshot").to_sample(with_commas, test[with_commas]).reference


@needs_data
def test_gsm8k_train_split_excludes_exemplars_and_gives_training_texts():
    samples = GSM8K(split="train").load()
    assert len(samples) == 7473 - 5 and samples[0].id == "gsm8k/train/5"
    texts = GSM8K(split="train", limit=4, seed=1).texts()
    assert len(texts) == 4 and all(t.startswith("Question: ") and "\nThe answer is " in t for t in texts)
    qa = GSM8K(split="train", format="qa_text", limit=4, seed=1).load()
    assert [s.turns[0] for s in qa] == texts and not any(s.chat for s in qa)
    with pytest.raises(UserError, match="test split"):
        GSM8K(split="test").texts()


@needs_data
def test_aime_boxed_prompt_and_math_amc_problem_solution_prompt():
    aime = AIME25().load()
    raw = _jsonl(DATA / "aime25" / "test.jsonl")
    assert aime[0].turns[0] == raw[0]["problem"] + \
        "\nPlease reason step by step, and put your final answer within \\boxed{}."
    assert aime[0].reference == "70" and aime[0].chat is True
    m = MATH500(limit=1, seed=None).load()[0]
    first = _jsonl(DATA / "math500" / "test.jsonl")[0]
    assert m.turns[0] == f"Problem:\n{first['problem']}\n\nSolution:" and m.reference == first["answer"]
    a = AMC(limit=1, seed=None).load()[0]
    problem = json.loads((DATA / "amc" / "amc.json").read_text())[0]["problem"]
    assert a.turns[0] == f"Problem:\n{problem}\n\nSolution:" and a.reference == "142"


@needs_data
def test_humaneval_mtbench_mmstar_formats():
    he = HumanEval().load()
    raw = _jsonl(DATA / "humaneval" / "HumanEval.jsonl.gz")
    assert he[0].id == "HumanEval/0" and he[0].turns == [raw[0]["prompt"]] and not he[0].chat
    assert he[0].meta["entry_point"] == raw[0]["entry_point"]
    mt = MTBench().load()
    assert all(len(s.turns) == 2 and s.chat for s in mt)
    assert MTBench(max_turns=1).load()[0].turns == mt[0].turns[:1]
    ms = MMStar().load()
    assert ms[0].turns[0].startswith("Which option describe the object relationship") and ms[0].chat
    assert all(s.reference in {"A", "B", "C", "D"} for s in ms)
    assert not any("_x005F_x000D_" in s.turns[0] for s in ms) and "\r" in ms[1045].turns[0]
    assert "prediction" not in ms[0].meta


# ---------------------------------------------------------------------- subset selection and sources
@needs_data
def test_limit_and_seed_select_a_deterministic_subset():
    ids = lambda **kw: [s.id for s in MATH500(**kw).load()]
    a, b, c = ids(limit=10, seed=1), ids(limit=10, seed=1), ids(limit=10, seed=2)
    assert len(a) == 10 and a == b and a != c
    order = {s.id: i for i, s in enumerate(MATH500().load())}
    assert [order[i] for i in a] == sorted(order[i] for i in a)  # kept in file order
    assert ids(limit=3, seed=None) == list(order)[:3]
    shuffled = ids(limit=10, seed=1, shuffle=True)
    assert sorted(shuffled) == sorted(a) and shuffled != a
    assert select_indices(range(5), None, 0, False) == [0, 1, 2, 3, 4]
    with pytest.raises(UserError, match="limit"):
        MATH500(limit=0)


def test_missing_file_lists_every_place_tried(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECMOE_DATA_DIR", str(tmp_path / "env"))
    with pytest.raises(UserError) as err:
        AIME25(data_dir=str(tmp_path / "opt")).load()
    msg = str(err.value)
    for part in ("recipe `path`: not set", str(tmp_path / "opt" / "aime25" / "test.jsonl"),
                 str(tmp_path / "env" / "aime25" / "test.jsonl"), "math-ai/aime25", "HF_HUB_OFFLINE",
                 "SPECMOE_DATA_DIR"):
        assert part in msg
    with pytest.raises(UserError, match="does not exist"):
        AIME25(path=str(tmp_path / "nope.jsonl")).load()
    with pytest.raises(UserError, match="unknown split"):
        AIME25(split="train").load()


@needs_data
def test_explicit_path_wins_over_data_dir(tmp_path):
    own = tmp_path / "aime.jsonl"
    own.write_text(json.dumps({"id": 7, "problem": "What is 1+1?", "answer": "2"}) + "\n")
    samples = AIME25(path=str(own), data_dir=str(DATA)).load()
    assert [(s.id, s.reference) for s in samples] == [("aime25/7", "2")]
    assert samples[0].turns[0].startswith("What is 1+1?\nPlease reason step by step")


def test_jsonl_prompts_field_template_turns(tmp_path, monkeypatch):
    f = tmp_path / "mine.jsonl"
    rows = [{"q": "2+2?", "a": 4, "prompt": "hello", "conv": ["hi", "and then?"], "key": "x1"},
            {"q": "3+3?", "a": 6, "prompt": "bye", "conv": ["yo"], "key": "x2"}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert [s.turns for s in JsonlPrompts(path=str(f)).load()] == [["hello"], ["bye"]]
    s = JsonlPrompts(path=str(f), template="Q: {q}\nA:", reference_field="a", id_field="key").load()[1]
    assert (s.id, s.turns, s.reference, s.chat) == ("jsonl/x2", ["Q: 3+3?\nA:"], "6", False)
    monkeypatch.setenv("SPECMOE_DATA_DIR", str(tmp_path))
    conv = JsonlPrompts(file="mine.jsonl", turns_field="conv", chat=True).load()
    assert conv[0].turns == ["hi", "and then?"] and conv[0].chat
    with pytest.raises(UserError, match="'missing'"):
        JsonlPrompts(path=str(f), template="{missing}").load()
    with pytest.raises(UserError, match="set `path`"):
        JsonlPrompts().load()


# ---------------------------------------------------------------------- rendering
@pytest.fixture(scope="module")
def tiny_tokenizer():
    """A byte-level BPE tokenizer trained here in milliseconds (no download), wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<bos>", "<|user|>", "<|assistant|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = ["Question: what is two plus two?\nAnswer: four.", "User: hi\nAssistant: hello"] * 20
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>")


def _decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=False)


def test_render_raw_and_plain_chat_fallback(tiny_tokenizer):
    tok = tiny_tokenizer
    raw = Sample(id="r", turns=["Question: what is 2+2?\nAnswer:"])
    ids = render_prompt(tok, raw)
    assert ids == tok(raw.turns[0])["input_ids"] and _decode(tok, ids) == raw.turns[0]
    chat = Sample(id="c", turns=["hi there", "and now?"], chat=True)
    assert _decode(tok, render_turn(tok, chat, 0)) == "User: hi there\nAssistant:"
    two = render_turn(tok, chat, 1, ["hello!"])
    assert _decode(tok, two) == "User: hi there\nAssistant: hello!\nUser: and now?\nAssistant:"
    assert plain_chat_text([{"role": "user", "content": "x"}]) == "User: x\nAssistant:"
    with pytest.raises(UserError, match="previous answer"):
        render_turn(tok, chat, 1, [])
    with pytest.raises(UserError, match="turn 2"):
        render_turn(tok, chat, 2, ["a", "b"])


def test_render_with_chat_template_multi_turn(tiny_tokenizer):
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    s = Sample(id="m", turns=["first question", "second question"], chat=True)
    assert _decode(tok, render_turn(tok, s, 0)) == "<|user|>first question\n<|assistant|>"
    text = _decode(tok, render_turn(tok, s, 1, ["first answer"]))
    assert text == ("<|user|>first question\n<|assistant|>first answer\n<|user|>second question\n"
                    "<|assistant|>")
    sys_text = _decode(tok, render_prompt(tok, s, system="be brief"))
    assert sys_text.startswith("<|system|>be brief\n")
    # raw samples ignore the chat template
    raw = Sample(id="r", turns=["Problem:\nx\n\nSolution:"])
    assert _decode(tok, render_prompt(tok, raw)) == raw.turns[0]


@needs_data
def test_mt_bench_renders_both_turns(tiny_tokenizer):
    s = MTBench(limit=1, seed=None).load()[0]
    text = _decode(tiny_tokenizer, render_turn(tiny_tokenizer, s, 1, ["A blog post."]))
    assert text == f"User: {s.turns[0]}\nAssistant: A blog post.\nUser: {s.turns[1]}\nAssistant:"


def test_hub_is_the_last_source_and_uses_the_offline_cache(tmp_path, monkeypatch):
    """With HF_HUB_OFFLINE=1 the real ``hf_hub_download`` still serves a file from the local hub cache."""
    import huggingface_hub.constants as hub_constants

    commit = "0" * 40
    snap = tmp_path / "hub" / "datasets--math-ai--aime25" / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "test.jsonl").write_text(json.dumps({"id": 0, "problem": "Hub problem?", "answer": 5}) + "\n")
    (tmp_path / "hub" / "datasets--math-ai--aime25" / "refs").mkdir()
    (tmp_path / "hub" / "datasets--math-ai--aime25" / "refs" / "main").write_text(commit)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("SPECMOE_DATA_DIR", str(tmp_path / "empty"))
    ds = AIME25()
    (s,) = ds.load()
    assert ds.source == snap / "test.jsonl"
    assert (s.reference, s.turns[0].split("\n")[0]) == ("5", "Hub problem?")
