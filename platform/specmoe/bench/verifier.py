# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): ``platform bench verifier`` (the union verifiers'
kernels on one MoE layer) moved into ``specmoe_plugins.verifiers.union.bench``. Every name taken from here is that
module's object, with a :class:`DeprecationWarning`; the core imports it only then (by name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["add_arguments", "run", "LayerSpec", "MODELS", "TINY_MODELS", "build_experts", "union_routing",  # noqa: F822 (__getattr__)
           "sweep"]

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.verifiers.union.bench", __all__, use=None)
