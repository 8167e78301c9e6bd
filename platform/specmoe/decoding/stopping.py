# SPDX-License-Identifier: Apache-2.0
"""Stop rules shared by autoregressive and speculative decoding (so both cut outputs identically)."""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["StopRule"]

#: context tokens per character of the longest stop string when decoding only the tail (byte-level: up to 4)
_TOKENS_PER_CHAR = 4


class StopRule:
    """Appends tokens to a row's output and says when the row is finished.

    A row finishes at ``max_new_tokens``, at the first stop token (kept), or at exactly the first token after
    which ``tokenizer.decode(output)`` contains a stop string (kept); only the tail is decoded per step.

    Args:
        max_new_tokens: length limit of the generated part.
        stop_strings: strings that end generation (needs ``tokenizer`` to decode outputs).
    """

    def __init__(self, max_new_tokens: int, stop_ids: Sequence[int] = (), stop_strings: Sequence[str] = (),
                 tokenizer: Any = None) -> None:
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if stop_strings and tokenizer is None:
            raise ValueError("stop_strings need a tokenizer")
        self.max_new_tokens = max_new_tokens
        self.stop_ids = set(int(i) for i in stop_ids)
        self.stop_strings = list(stop_strings)
        self.tokenizer = tokenizer
        longest = max((len(s) for s in self.stop_strings), default=0)
        self._context = _TOKENS_PER_CHAR * longest + _TOKENS_PER_CHAR

    def extend(self, out: list[int], new: Sequence[int]) -> bool:
        """Append ``new`` to ``out`` in place, cutting at the stop rules; return True if finished."""
        start = len(out)
        for t in new:
            out.append(int(t))
            if len(out) >= self.max_new_tokens or int(t) in self.stop_ids:
                return self._strings(out, start) or True
        return self._strings(out, start)

    def _strings(self, out: list[int], start: int) -> bool:
        """Cut ``out`` after the first token whose prefix decodes to a text with a stop string (tokens before
        ``start`` were checked by earlier calls)."""
        if not self.stop_strings or len(out) == start or not self._tail_has_stop(out, start):
            return False
        decode = self.tokenizer.decode
        if not any(s in decode(out) for s in self.stop_strings):
            return False
        for k in range(max(start, 1), len(out) + 1):  # shortest prefix that contains a stop string
            if any(s in decode(out[:k]) for s in self.stop_strings):
                del out[k:]
                return True
        return True

    def _tail_has_stop(self, out: list[int], start: int) -> bool:
        """Whether a stop string ends inside the text of the tokens from ``start`` on (decodes only the tail)."""
        decode = self.tokenizer.decode
        begin = max(0, start - self._context)
        before = decode(out[begin:start]) if start > begin else ""
        text = decode(out[begin:])
        keep = 0  # length of the text the new tokens left unchanged: a match must end after it
        while keep < min(len(before), len(text)) and before[keep] == text[keep]:
            keep += 1
        return any(not s or text.find(s, max(0, keep - len(s) + 1)) >= 0 for s in self.stop_strings)
