# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): the expert sizes moved into the ``hf``
target's folder, ``specmoe_plugins.targets.hf.expert_bytes``. Every name taken from here is that module's object,
with a :class:`DeprecationWarning`; the core imports it only then (by name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["ExpertBytes", "expert_bytes", "loaded_bytes_per_expert", "stored_bytes_per_expert"]  # noqa: F822

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.targets.hf.expert_bytes", __all__, use=None)
