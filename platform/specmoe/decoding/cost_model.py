# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias of :mod:`specmoe_plugins.selectors.goodput.cost_model`: the step cost model serves only the
``goodput`` selector and moved into its folder (issue 24.1). Every name still works, with a
:class:`DeprecationWarning`; the alias goes in the release :data:`specmoe.utils.deprecation.REMOVED_IN` names. The
new module is named, not imported, so the core still imports no plugin."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

_NEW = "specmoe_plugins.selectors.goodput.cost_model"
_NAMES = ["FEATURES", "DEFAULT_FEATURES", "VerifyShape", "CostModel", "huber_fit", "relative_errors"]
__all__ = list(_NAMES)  # served by __getattr__

__getattr__, __dir__ = moved_names(__name__, _NEW, __all__, use=_NEW)
