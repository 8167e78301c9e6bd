# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): moved into the vLLM peer's plugin
folder, ``specmoe_plugins.peers.vllm.bench``. Every name taken from here is that module's object, with a
:class:`DeprecationWarning`; the core imports it only then (by name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["add_arguments", "run", "measure", "agreement", "check_draft"]  # noqa: F822

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.peers.vllm.bench", __all__, use=None)
