# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): moved into the vLLM peer's plugin
folder, ``specmoe_plugins.peers.vllm.export``. Every name taken from here is that module's object, with a
:class:`DeprecationWarning`; the core imports it only then (by name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["FORMAT", "read_token_table", "read_cost_model", "acceptance_from_run",  # noqa: F822
           "fit_vllm_steps", "build_policy", "add_parser", "run"]

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.peers.vllm.export", __all__, use=None)
