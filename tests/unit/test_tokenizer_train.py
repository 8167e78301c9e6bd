# SPDX-License-Identifier: Apache-2.0
"""Locally trained byte-level BPE tokenizer, its chat template, and the packed text data module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specmoe.errors import UserError
from specmoe_plugins.targets.tiny.text_data import (
    GSM8K_TRAIN,
    SeededSampler,
    TextDataModule,
    TextSource,
    group_documents,
    pack_documents,
    read_documents,
)
from specmoe_plugins.targets.tiny.tokenizer import BOS, EOS, PAD, load_tokenizer, render_exchange, train_bpe_tokenizer

NAMES = ["Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Ken", "Alexis", "Tina", "Randy"]


def _records(n: int, offset: int = 0) -> list[dict]:
    out = []
    for i in range(offset, offset + n):
        name, a, b = NAMES[i % len(NAMES)], 3 + i, 7 + 2 * i
        out.append({"question": f"{name} has {a} apples and buys {b} more. How many apples does {name} have?",
                    "answer": f"{name} has {a}+{b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b:,}"})
    return out


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    (root / "gsm8k").mkdir()
    for split, recs in (("train", _records(1200)), ("test", _records(5, offset=5000))):
        with (root / "gsm8k" / f"{split}.jsonl").open("w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in recs)
    return root


@pytest.fixture(scope="module")
def tokenizer(data_dir, tmp_path_factory):
    tok = train_bpe_tokenizer(read_documents(data_dir, [GSM8K_TRAIN]), vocab_size=400)
    out = tmp_path_factory.mktemp("tok")
    tok.save_pretrained(out)
    return load_tokenizer(out)


def test_saved_tokenizer_loads_with_autotokenizer(tokenizer):
    from transformers import AutoTokenizer

    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (BOS, EOS, PAD)
    assert len({tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}) == 3
    assert len(tokenizer) == 400
    assert isinstance(tokenizer, type(AutoTokenizer.from_pretrained(tokenizer.name_or_path)))


@pytest.mark.parametrize("text", ["Natalia sold 48/2 = 24 clips.\n#### 72",
                                  "Janet’s ducks: 16 eggs 🦆 —  ok", "  leading spaces\tand tabs\n\n"])
def test_byte_level_roundtrip_is_lossless(tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_bpe_learned_merges(tokenizer):
    text = "Natalia has 12 apples and buys 17 more. How many apples does Natalia have?"
    assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) < len(text.encode()) / 2


def test_chat_template_matches_training_documents(tokenizer):
    q, a = "How many apples?", "3+4 = 7 apples.\nThe answer is 7."
    chat = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    assert tokenizer.apply_chat_template(chat, tokenize=False) == BOS + render_exchange(q, a) + EOS
    prompt = tokenizer.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == f"{BOS}Question: {q}\nAnswer:"
    # the prompt's tokens are a prefix of the full document's: generation continues at a token boundary
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    d_ids = tokenizer(BOS + render_exchange(q, a) + EOS, add_special_tokens=False)["input_ids"]
    assert d_ids[:len(p_ids)] == p_ids and d_ids[-1] == tokenizer.eos_token_id
    sys_prompt = tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."}, chat[0]],
                                               tokenize=False, add_generation_prompt=True)
    assert sys_prompt == f"{BOS}Be brief.\nQuestion: {q}\nAnswer:"


def test_gsm8k_cot_format_and_test_split_refused(data_dir):
    docs = read_documents(data_dir, [GSM8K_TRAIN])
    assert len(docs) == 1200
    assert docs[0] == ("Question: Natalia has 3 apples and buys 7 more. How many apples does Natalia have?\n"
                       "Answer: Natalia has 3+7 = 10 apples.\nThe answer is 10.")
    assert docs[597].endswith("= 1801 apples.\nThe answer is 1801.")  # "#### 1,801": separator dropped
    raw = read_documents(data_dir, [TextSource(format="template", template="{answer}", limit=2)])
    assert raw[0].startswith("Natalia has 3+7 = <<3+7=10>>10") and len(raw) == 2
    with pytest.raises(UserError, match="test split"):
        read_documents(data_dir, [TextSource(path="gsm8k/test.jsonl")])
    assert len(read_documents(data_dir, [TextSource(path="gsm8k/test.jsonl")], allow_test=True)) == 5
    with pytest.raises(UserError, match="no field"):
        read_documents(data_dir, [TextSource(format="template", template="{solution}")])
    with pytest.raises(UserError, match="does not exist"):
        read_documents(data_dir, [TextSource(path="gsm8k/nope.jsonl")])


def test_group_and_pack(tokenizer):
    docs = [f"doc {i}" for i in range(20)]
    groups = group_documents(docs, 4, seed=1)
    assert "\n\n".join(groups) == "\n\n".join(docs)
    assert all(1 <= g.count("doc") <= 4 for g in groups) and len(groups) < len(docs)
    assert groups == group_documents(docs, 4, seed=1)
    blocks, n_tok = pack_documents(groups, tokenizer, block_size=8)
    assert blocks.shape == (n_tok // 8, 8)
    expected = []
    for g in groups:
        expected += [tokenizer.bos_token_id, *tokenizer(g, add_special_tokens=False)["input_ids"],
                     tokenizer.eos_token_id]
    assert n_tok == len(expected) and blocks.flatten().tolist() == expected[:blocks.numel()]


def test_data_module_splits_by_document(tokenizer, data_dir):
    def make(seed):
        dm = TextDataModule(tokenizer, data_dir, block_size=32, batch_size=4, val_fraction=0.05, seed=seed,
                            docs_per_context=3)
        dm.setup("fit")
        return dm

    a, b, c = make(0), make(0), make(1)
    assert len(a.val_docs) == 60
    train_docs = set(read_documents(data_dir, [GSM8K_TRAIN])) - set(a.val_docs)
    assert len(train_docs) == 1140  # every record's text is unique, so no document is in both splits
    assert a.val_docs == b.val_docs and a.val_docs != c.val_docs
    assert (a.train_blocks == b.train_blocks).all()
    batch = next(iter(a.train_dataloader()))
    assert batch["input_ids"].shape == (4, 32)


def test_seeded_sampler_resume_skips_once():
    s = SeededSampler(10, seed=3)
    full = list(s)
    assert sorted(full) == list(range(10)) and list(s) == full
    s.resume_at = (0, 4)
    assert list(s) == full[4:]
    assert list(s) == full  # only the interrupted epoch is shortened
    s.set_epoch(1)
    assert list(s) != full
