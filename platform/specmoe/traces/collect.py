# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): routing-trace collection moved into the
``collect_traces`` stage's folder, ``specmoe_plugins.stages.collect_traces.collect`` (only that stage runs it; the
traces' format, which every reader shares, stays in :mod:`specmoe.traces.format`). Every name taken from here is
that module's object, with a :class:`DeprecationWarning`; the core imports it only then (by name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["CollectOptions", "collect_traces", "split_samples", "plan_shards", "encode_turn",  # noqa: F822
           "route_sequences", "usable_tokenizer", "trace_meta", "summarize"]

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.stages.collect_traces.collect", __all__, use=None)
