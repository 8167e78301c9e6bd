# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias of :mod:`specmoe.interfaces.tree` (kept through specmoe 0.2.x, removed in 0.3.0).

:class:`~specmoe.interfaces.tree.DraftTree` and its helpers moved to ``specmoe.interfaces.tree`` so that the
interfaces are a leaf package. Plugins should import them from :mod:`specmoe.plugin_api` (the stable plugin API)
or from ``specmoe.interfaces.tree``. Every name taken from here is the same object as there, and taking one
emits a :class:`DeprecationWarning` naming its new place.
"""

from __future__ import annotations

from specmoe.interfaces import tree as _new
from specmoe.utils.deprecation import moved_names

__all__ = ["DraftTree", "ancestor_matrix", "is_ancestor_closed", "close_under_ancestors"]  # noqa: F822 (__getattr__)

__getattr__, __dir__ = moved_names(__name__, _new, __all__)
