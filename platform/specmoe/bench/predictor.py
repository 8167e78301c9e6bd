# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): ``platform bench predictor``, now
``platform bench draft_head``, moved into the ``draft_head`` predictor's folder,
``specmoe_plugins.predictors.draft_head.bench`` (found through the entry-point group ``specmoe.benches``). Every
name taken from here is that module's object, with a :class:`DeprecationWarning`; the core imports it only then
(by name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["add_arguments", "run", "GPTOSS120B", "head_case", "demo_target", "learned_case"]  # noqa: F822

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.predictors.draft_head.bench", __all__, use=None)
