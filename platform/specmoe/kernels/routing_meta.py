# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): the union kernels' routing metadata moved into
the union verifiers' folder, ``specmoe_plugins.verifiers.union.routing_meta`` (only its kernels
read it). Every name taken from here is that module's object, with a :class:`DeprecationWarning`; the core imports
it only then, by name."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["RoutingMeta", "routing_meta"]  # noqa: F822

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.verifiers.union.routing_meta", __all__,
                                   use=None)
