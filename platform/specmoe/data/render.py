# SPDX-License-Identifier: Apache-2.0
"""Turning a :class:`~specmoe.interfaces.dataset.Sample` turn into prompt token ids for a HF tokenizer.

* ``sample.chat == False``: ``turns[0]`` is a raw completion prompt, tokenized with the usual special tokens.
* ``sample.chat == True``: the conversation so far (user turns, the model's previous answers between them)
  goes through ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``; a tokenizer without a chat
  template gets the plain fallback: ``"User: ...\\n"`` / ``"Assistant: ...\\n"`` lines ending with
  ``"Assistant:"`` (an optional ``"System: ...\\n"`` first).

Multi-turn benchmarks are generated one turn at a time: turn ``k`` with the model's answers to turns ``0..k-1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

from specmoe.errors import UserError
from specmoe.interfaces.dataset import Sample

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["has_chat_template", "messages_for_turn", "plain_chat_text", "prompt_text", "render_prompt",
           "render_turn"]


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    """True when ``tokenizer`` carries a (non-empty) chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def messages_for_turn(sample: Sample, turn: int = 0, answers: Sequence[str] = (),
                      system: Optional[str] = None) -> list[dict[str, str]]:
    """The chat messages ``[{"role": ..., "content": ...}, ...]`` that precede the model's answer to
    ``sample.turns[turn]``, ending with that user message; ``answers``: the model's answers to turns
    ``0..turn-1`` (at least ``turn`` of them)."""
    if not 0 <= turn < len(sample.turns):
        raise UserError(f"sample {sample.id}: turn {turn} requested, it has {len(sample.turns)} turn(s)")
    if len(answers) < turn:
        raise UserError(f"sample {sample.id}: turn {turn} needs the model's {turn} previous answer(s), "
                        f"got {len(answers)}")
    msgs: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    for k in range(turn):
        msgs.append({"role": "user", "content": sample.turns[k]})
        msgs.append({"role": "assistant", "content": answers[k]})
    msgs.append({"role": "user", "content": sample.turns[turn]})
    return msgs


def plain_chat_text(messages: Sequence[dict[str, str]]) -> str:
    """The documented fallback for tokenizers without a chat template (see the module docstring)."""
    names = {"system": "System", "user": "User", "assistant": "Assistant"}
    lines = [f"{names.get(m['role'], m['role'].capitalize())}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nAssistant:"


def prompt_text(tokenizer: PreTrainedTokenizerBase, sample: Sample, turn: int = 0, answers: Sequence[str] = (),
                system: Optional[str] = None) -> tuple[str, bool]:
    """The prompt as text, and whether it must be tokenized with the tokenizer's special tokens (``False`` for
    chat-template output, which already holds them)."""
    msgs = messages_for_turn(sample, turn, answers, system)
    if not sample.chat:
        return "".join(m["content"] for m in msgs if m["role"] != "system"), True
    if has_chat_template(tokenizer):
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return text, False
    return plain_chat_text(msgs), True


def render_turn(tokenizer: PreTrainedTokenizerBase, sample: Sample, turn: int = 0, answers: Sequence[str] = (),
                system: Optional[str] = None) -> list[int]:
    """Prompt token ids (a list of ints) for answering ``sample.turns[turn]``, given the model's decoded
    ``answers`` to the earlier turns; ``system``: optional system prompt (chat samples only)."""
    text, special = prompt_text(tokenizer, sample, turn, answers, system)
    ids = tokenizer(text, add_special_tokens=special)["input_ids"]
    return [int(t) for t in ids]


def render_prompt(tokenizer: PreTrainedTokenizerBase, sample: Sample, system: Optional[str] = None) -> list[int]:
    """Prompt token ids of the first turn: ``render_turn(tokenizer, sample, 0)``."""
    return render_turn(tokenizer, sample, 0, (), system)
