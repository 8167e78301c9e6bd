# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): the target's grouped attention with additive
float masks moved into the Hugging Face target's folder, ``specmoe_plugins.targets.hf.attention`` (the only code
that registers or calls it). Every name taken from here is that module's object, with a
:class:`DeprecationWarning`; the core imports it only then (by name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["ATTN_IMPLEMENTATION", "grouped_attention", "register"]  # noqa: F822 (__getattr__)

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.targets.hf.attention", __all__, use=None)
