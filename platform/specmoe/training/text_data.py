# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): the packed causal-LM text data of the tiny target
moved into the trained tiny target's folder, ``specmoe_plugins.targets.tiny.text_data``. Every name taken from here
is that module's object, with a :class:`DeprecationWarning`; the core imports it only then (by name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["TextSource", "GSM8K_TRAIN", "FORMATTERS", "read_documents", "group_documents",  # noqa: F822
           "pack_documents", "TextDataModule", "SeededSampler"]

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.targets.tiny.text_data", __all__, use=None)
