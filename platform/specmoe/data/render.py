# SPDX-License-Identifier: Apache-2.0
"""Turning a :class:`~specmoe.interfaces.dataset.Sample` turn into prompt token ids for a HF tokenizer.

* ``sample.chat == False``: ``turns[0]`` is a raw completion prompt, tokenized as text with the tokenizer's
  usual special tokens (a BOS where the model expects one).
* ``sample.chat == True``: the conversation so far (user turns, with the model's previous answers between
  them) goes through ``tokenizer.apply_chat_template(..., add_generation_prompt=True)`` when the tokenizer
  has a chat template. A tokenizer without one (the locally trained tiny tokenizers) gets the plain fallback

  .. code-block:: text

      User: <turn 1>
      Assistant: <answer 1>
      User: <turn 2>
      Assistant:

  i.e. one ``"User: ...\\n"`` / ``"Assistant: ...\\n"`` line pair per exchange, ending with ``"Assistant:"``
  (an optional system prompt comes first as ``"System: ...\\n"``).

Multi-turn benchmarks (MT-Bench) are generated one turn at a time: turn ``k`` is rendered with the model's
answers to turns ``0..k-1`` (see :func:`render_turn`).
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
    """The chat messages that precede the model's answer to ``sample.turns[turn]``.

    Args:
        sample: the benchmark item.
        turn: index of the user turn to answer.
        answers: the model's answers to turns ``0..turn-1`` (at least ``turn`` of them).
        system: optional system prompt.

    Returns:
        ``[{"role": ..., "content": ...}, ...]`` ending with the user message ``turns[turn]``.
    """
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
    """The prompt as text, and whether it must be tokenized with the tokenizer's special tokens.

    Text rendered by a chat template already holds its special tokens (so ``False``); raw prompts and the
    plain fallback are tokenized like ordinary text (``True``).
    """
    msgs = messages_for_turn(sample, turn, answers, system)  # also checks turn / answers
    if not sample.chat:
        # completion prompts: earlier turns and answers are simply concatenated (no system prompt)
        return "".join(m["content"] for m in msgs if m["role"] != "system"), True
    if has_chat_template(tokenizer):
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return text, False
    return plain_chat_text(msgs), True


def render_turn(tokenizer: PreTrainedTokenizerBase, sample: Sample, turn: int = 0, answers: Sequence[str] = (),
                system: Optional[str] = None) -> list[int]:
    """Prompt token ids for answering ``sample.turns[turn]``.

    Args:
        tokenizer: a Hugging Face tokenizer (``PreTrainedTokenizerBase``).
        sample: the benchmark item.
        turn: which user turn to answer (0 for single-turn benchmarks).
        answers: the model's decoded answers to the earlier turns (multi-turn only).
        system: optional system prompt (chat samples only).

    Returns:
        ``[L]`` prompt token ids (a plain list of ints).
    """
    text, special = prompt_text(tokenizer, sample, turn, answers, system)
    ids = tokenizer(text, add_special_tokens=special)["input_ids"]
    return [int(t) for t in ids]


def render_prompt(tokenizer: PreTrainedTokenizerBase, sample: Sample, system: Optional[str] = None) -> list[int]:
    """Prompt token ids of the first turn: ``render_turn(tokenizer, sample, 0)``."""
    return render_turn(tokenizer, sample, 0, (), system)
