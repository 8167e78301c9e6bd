# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): the router load balancing of the tiny target's
training moved into the trained tiny target's folder, ``specmoe_plugins.targets.tiny.router_balance``. Every name
taken from here is that module's object, with a :class:`DeprecationWarning`; the core imports it only then (by
name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["RouterCollapseError", "ExpertCounter", "BiasBalancer", "router_losses", "router_bias",  # noqa: F822
           "balance_stats", "check_router_collapse", "moe_layer_ids"]

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.targets.tiny.router_balance", __all__, use=None)
