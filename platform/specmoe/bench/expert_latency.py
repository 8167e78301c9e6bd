# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): ``platform bench expert_latency`` (the latency-vs-
unique-experts curve goodput's cost model rests on) moved into ``specmoe_plugins.selectors.goodput.expert_latency``.
Every name taken from here is that module's object, with a :class:`DeprecationWarning`; the core imports it only
then (by name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["add_arguments", "run", "forced_routing", "override_routers", "fit_line",  # noqa: F822 (__getattr__)
           "measure"]

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.selectors.goodput.expert_latency", __all__, use=None)
