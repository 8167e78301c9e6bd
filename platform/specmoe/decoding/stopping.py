# SPDX-License-Identifier: Apache-2.0
"""Stop rules shared by autoregressive and speculative decoding (so both cut outputs identically)."""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["StopRule"]


class StopRule:
    """Appends tokens to a row's output and says when the row is finished.

    A row finishes at ``max_new_tokens``, at the first stop token (kept in the output), or at the first
    token after which the decoded output contains a stop string (kept).

    Args:
        max_new_tokens: length limit of the generated part.
        stop_ids: token ids that end generation.
        stop_strings: strings that end generation (needs ``tokenizer``).
        tokenizer: used to decode outputs for ``stop_strings``.
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

    def extend(self, out: list[int], new: Sequence[int]) -> bool:
        """Append ``new`` to ``out`` in place, cutting at the stop rules; return True if finished."""
        start = len(out)
        for t in new:
            out.append(int(t))
            if len(out) >= self.max_new_tokens or int(t) in self.stop_ids:
                return self._strings(out, start) or True
        return self._strings(out, start)

    def _strings(self, out: list[int], start: int) -> bool:
        if not self.stop_strings or len(out) == start:
            return False
        text = self.tokenizer.decode(out)
        if not any(s in text for s in self.stop_strings):
            return False
        for k in range(max(start, 1), len(out) + 1):  # shortest prefix that contains a stop string
            if any(s in self.tokenizer.decode(out[:k]) for s in self.stop_strings):
                del out[k:]
                return True
        return True
