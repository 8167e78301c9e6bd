# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias of :mod:`specmoe_plugins.selectors.goodput.calibration`: the cost-model calibration serves only
the goodput selector and moved into its folder (issue 24.1; its command line is ``platform bench goodput_cost``,
which was ``platform bench expert_latency --calibrate``). Its names still work, with a :class:`DeprecationWarning`,
until :data:`specmoe.utils.deprecation.REMOVED_IN`; the new module is named, not imported."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

_NEW = "specmoe_plugins.selectors.goodput.calibration"
_NAMES = ["grid", "calibrate", "shape_of", "fit_split", "engine_check"]
__all__ = list(_NAMES)  # served by __getattr__

__getattr__, __dir__ = moved_names(__name__, _NEW, __all__, use=_NEW)
