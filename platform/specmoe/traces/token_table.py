# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): the token table moved into the
``token_table`` predictor's folder, ``specmoe_plugins.predictors.token_table.table`` (its files are unchanged).
Every name taken from here is that module's object, with a :class:`DeprecationWarning`; the core imports it only
then (by name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["TokenTable", "build_token_table", "TABLE_FILE", "TABLE_META"]  # noqa: F822 (__getattr__)

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.predictors.token_table.table", __all__, use=None)
