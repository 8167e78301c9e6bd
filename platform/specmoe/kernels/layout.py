# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): the experts-module layout the union kernels read
moved into ``specmoe_plugins.verifiers.union.layout``. Every name taken from here is that module's object, with a
:class:`DeprecationWarning`; the core imports it only then (by name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["ExpertsLayout", "experts_layout", "expert_forward", "apply_gate", "ACT_SILU", "ACT_SWIGLU_OAI"]  # noqa: F822 (__getattr__)

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.verifiers.union.layout", __all__, use=None)
