# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): the ``draft_head`` network moved into the
predictor's folder, ``specmoe_plugins.predictors.draft_head.model``. Every name taken from here is that module's
object, with a :class:`DeprecationWarning`; the core imports it only then (by name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["DRAFT_HEAD_FORMAT", "DraftHeadConfig", "DraftHeadNet", "predict_sets",  # noqa: F822
           "save_draft_head", "load_draft_head"]

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.predictors.draft_head.model", __all__, use=None)
