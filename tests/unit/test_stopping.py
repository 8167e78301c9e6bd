# SPDX-License-Identifier: Apache-2.0
"""Stop rules: stop strings are found by decoding only the new tokens (and a few before them), and rows are cut
exactly where the reference rule (decode the whole output after every call) cuts them, on a byte-level BPE
tokenizer whose characters may span several tokens."""

from __future__ import annotations

import random

import pytest

from specmoe.decoding.stopping import StopRule
from specmoe_plugins.targets.tiny.tokenizer import train_bpe_tokenizer

TEXTS = ["Question: Natalia sold 48 clips.\nAnswer: 48 / 2 = 24.\n#### 72\n\n",
         "日本語のテキスト, café crème, naïve 😀 emoji 🚀 and more 日本.\n\n",
         "def f(x):\n    return x * 2  # ok\n\nQuestion: again?\n"]
STOPS = [["####"], ["\n\n"], ["日本"], ["😀", "Question:"], ["é c", "24."], [""]]


class ReferenceStop:
    """The specification: after every call, decode the whole output and cut at the shortest prefix (from the
    call's first new token) whose text contains a stop string."""

    def __init__(self, max_new_tokens, stop_ids, stop_strings, tokenizer):
        self.max_new_tokens, self.stop_ids = max_new_tokens, set(stop_ids)
        self.stop_strings, self.tokenizer = list(stop_strings), tokenizer

    def extend(self, out, new):
        start = len(out)
        for t in new:
            out.append(int(t))
            if len(out) >= self.max_new_tokens or int(t) in self.stop_ids:
                return self._strings(out, start) or True
        return self._strings(out, start)

    def _strings(self, out, start):
        if not self.stop_strings or len(out) == start:
            return False
        if not any(s in self.tokenizer.decode(out) for s in self.stop_strings):
            return False
        for k in range(max(start, 1), len(out) + 1):
            if any(s in self.tokenizer.decode(out[:k]) for s in self.stop_strings):
                del out[k:]
                return True
        return True


class CountingTokenizer:
    """Records the length of every token list it decodes."""

    def __init__(self, tok):
        self.tok, self.lengths = tok, []

    def decode(self, ids):
        self.lengths.append(len(ids))
        return self.tok.decode(ids)


@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(TEXTS * 20, vocab_size=300, min_frequency=2)


def _streams(tok, rng):
    text = "".join(TEXTS)
    ids = tok.encode(text, add_special_tokens=False)
    out = [ids, ids[7:], ids[::-1]]
    for _ in range(12):  # random tokens, including lone bytes of multi-byte characters
        out.append([rng.randrange(len(tok)) for _ in range(rng.randrange(10, 80))])
    return out


def test_tail_decoding_cuts_exactly_like_full_decoding(tok):
    rng = random.Random(0)
    stopped_by: dict[str, int] = {}
    for stream in _streams(tok, rng):
        for stops in STOPS:
            for max_new in (len(stream), 25):
                rule, ref = StopRule(max_new, [], stops, tok), ReferenceStop(max_new, [], stops, tok)
                out, out_ref, i = [], [], 0
                while i < len(stream):
                    n = rng.randint(1, 5)  # a speculative step appends several tokens at once
                    done = rule.extend(out, stream[i:i + n])
                    done_ref = ref.extend(out_ref, stream[i:i + n])
                    assert (done, out) == (done_ref, out_ref), (stops, i)
                    i += n
                    if done:
                        if len(out) < max_new:
                            stopped_by[stops[0]] = stopped_by.get(stops[0], 0) + 1
                        break
    # every stop set (multi-byte ones included) really ended some rows before their length limit
    assert set(stopped_by) == {s[0] for s in STOPS} and sum(stopped_by.values()) > 30, stopped_by


def test_only_the_tail_is_decoded(tok):
    ids = tok.encode(TEXTS[2] * 40, add_special_tokens=False)
    counting = CountingTokenizer(tok)
    rule = StopRule(10_000, [], ["never in the text", "####"], counting)
    out: list[int] = []
    for i in range(0, len(ids), 3):
        assert not rule.extend(out, ids[i:i + 3])
    assert len(out) > 400
    longest = max(counting.lengths)
    assert longest <= rule._context + 3, longest  # never the whole output
    assert sum(counting.lengths) < 60 * len(out)  # linear in the output length, not quadratic
    # a hit is confirmed on the decoded output itself and cut at the first token that completes it
    stop = tok.encode("####", add_special_tokens=False)
    assert not rule.extend(out, stop[:-1]) or len(stop) == 1
    assert rule.extend(out, stop[-1:] + ids[:5]) and tok.decode(out).endswith("####")
