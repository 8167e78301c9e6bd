# SPDX-License-Identifier: Apache-2.0
"""A byte-level BPE tokenizer trained locally with ``tokenizers`` and wrapped as ``PreTrainedTokenizerFast``.

Saved with ``save_pretrained`` next to the model, so ``AutoTokenizer.from_pretrained(dir)`` loads it. Special
tokens: ``<|startoftext|>`` (bos), ``<|endoftext|>`` (eos), ``<|pad|>`` (pad). Plain ``tokenizer(text)`` adds
bos; ``apply_chat_template`` (which tokenizes without special tokens) writes bos itself.

The chat template is deliberately plain text and matches :data:`DOCUMENT_TEMPLATE`, the format the target
is pretrained on, so a chat-rendered question is in-distribution::

    <|startoftext|>Question: {user}\\nAnswer: {assistant}<|endoftext|>

``add_generation_prompt`` appends ``Answer:``; a system message is written first, followed by a newline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

__all__ = ["BOS", "EOS", "PAD", "CHAT_TEMPLATE", "DOCUMENT_TEMPLATE", "train_bpe_tokenizer", "load_tokenizer",
           "render_exchange"]

BOS = "<|startoftext|>"
EOS = "<|endoftext|>"
PAD = "<|pad|>"

#: ``str.format`` template of one pretraining document (without bos/eos) from a question and its answer
DOCUMENT_TEMPLATE = "Question: {question}\nAnswer: {answer}"

# HF renders templates with trim_blocks/lstrip_blocks: every newline is written inside an expression.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\\n' }}"
    "{% elif message['role'] == 'user' %}{{ 'Question: ' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ 'Answer: ' + message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('unsupported chat role: ' + message['role']) }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Answer:' }}{% endif %}"
)


def render_exchange(question: str, answer: str) -> str:
    """One pretraining document (no bos/eos), identical to the chat rendering of the same exchange."""
    return DOCUMENT_TEMPLATE.format(question=question, answer=answer)


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 4096, *, min_frequency: int = 2,
                        model_max_length: int = 131072) -> Any:
    """Train a byte-level BPE tokenizer on ``texts``.

    Args:
        texts: training documents (any iterable of strings; iterated once).
        vocab_size: total vocabulary size including the 256 byte symbols and the 3 special tokens.
        min_frequency: minimum pair count for a merge.
        model_max_length: recorded in the tokenizer config (truncation limit of HF calls).

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with bos/eos/pad set and :data:`CHAT_TEMPLATE`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [EOS, BOS, PAD]
    if vocab_size < 256 + len(specials) + 1:
        raise ValueError(f"vocab_size {vocab_size} is too small for a byte-level BPE (need > 259)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1",
                                      special_tokens=[(BOS, bos_id)]),
    ])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   chat_template=CHAT_TEMPLATE, model_max_length=model_max_length,
                                   clean_up_tokenization_spaces=False)


def load_tokenizer(path: str | Path) -> Any:
    """Load a tokenizer saved by ``save_pretrained`` (any kind ``AutoTokenizer`` understands)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
