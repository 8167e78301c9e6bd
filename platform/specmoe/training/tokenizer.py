# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): the tiny target's byte-level BPE tokenizer moved
into the trained tiny target's folder, ``specmoe_plugins.targets.tiny.tokenizer``. Every name taken from here is
that module's object, with a :class:`DeprecationWarning`; the core imports it only then (by name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["BOS", "EOS", "PAD", "CHAT_TEMPLATE", "DOCUMENT_TEMPLATE", "train_bpe_tokenizer",  # noqa: F822
           "load_tokenizer", "render_exchange"]

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.targets.tiny.tokenizer", __all__, use=None)
