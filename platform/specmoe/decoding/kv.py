# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias of :mod:`specmoe.interfaces.kv` (kept through specmoe 0.2.x, removed in 0.3.0).

:class:`~specmoe.interfaces.kv.KVState` moved to ``specmoe.interfaces.kv`` so that the interfaces are a leaf
package. Plugins should import it from :mod:`specmoe.plugin_api`. Every name taken from here is the same object
as there, with a :class:`DeprecationWarning` naming its new place.
"""

from __future__ import annotations

from specmoe.interfaces import kv as _new
from specmoe.utils.deprecation import moved_names

__all__ = ["KVState", "additive_mask"]  # noqa: F822 (__getattr__)

__getattr__, __dir__ = moved_names(__name__, _new, __all__)
