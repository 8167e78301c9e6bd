# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias of :mod:`specmoe.interfaces.tree` (kept through specmoe 0.2.x, removed in 0.3.0).

:class:`~specmoe.interfaces.tree.DraftTree` and its helpers moved to ``specmoe.interfaces.tree`` so that the
interfaces are a leaf package. Plugins should import them from :mod:`specmoe.plugin_api` (the stable plugin API)
or from ``specmoe.interfaces.tree``. Every name taken from here is the same object as there, and taking one
emits a :class:`DeprecationWarning` naming its new place.
"""

from __future__ import annotations

import warnings
from typing import Any

from specmoe.interfaces import tree as _new

__all__ = ["DraftTree", "ancestor_matrix", "is_ancestor_closed", "close_under_ancestors"]  # noqa: F822 (__getattr__)


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (it is a deprecated alias of "
                             f"'specmoe.interfaces.tree'; import from 'specmoe.plugin_api')")
    warnings.warn(f"'{__name__}.{name}' moved to 'specmoe.interfaces.tree.{name}': import it from "
                  f"'specmoe.plugin_api' (the stable plugin API); the alias '{__name__}' will be removed in "
                  f"specmoe 0.3.0", DeprecationWarning, stacklevel=2)
    return getattr(_new, name)


def __dir__() -> list[str]:
    return sorted(__all__)
