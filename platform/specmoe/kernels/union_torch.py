# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): the PyTorch union experts (the kernels'
specification) moved into ``specmoe_plugins.verifiers.union.reference``. Every name taken from here is that module's
object, with a :class:`DeprecationWarning`; the core imports it only then (by name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["union_experts_forward", "grouped_supported", "prepare", "packed_experts", "PACK_MAX_BYTES",  # noqa: F822 (__getattr__)
           "graph_experts"]

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.verifiers.union.reference", __all__, use=None)
