# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): the Triton union kernels moved into the
union verifiers' folder, ``specmoe_plugins.verifiers.union.kernels`` (the only code that runs
them). Every name taken from here is that module's object, with a :class:`DeprecationWarning`; the core imports it
(and ``triton``) only then, by name."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["UnionBlocks", "union_moe", "is_interpreted"]  # noqa: F822

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.verifiers.union.kernels", __all__, use=None)
