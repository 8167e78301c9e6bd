# SPDX-License-Identifier: Apache-2.0
"""Aliases of moved modules: every name taken from the old place is the new place's object, with a warning."""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType
from typing import Any, Callable

__all__ = ["moved_names", "REMOVED_IN"]

#: the release that drops the aliases (they are kept for one minor version)
REMOVED_IN = "0.3.0"


def moved_names(old: str, new: ModuleType | str, names: list[str], use: str | None = "specmoe.plugin_api"
                ) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """``(__getattr__, __dir__)`` for a deprecated module ``old`` whose ``names`` now live in ``new``.

    Taking a name gives ``getattr(new, name)`` and emits a :class:`DeprecationWarning` naming the new place and
    where to import it from (``use``: the stable plugin API by default; ``None``: the new module); any other name
    is an :class:`AttributeError` that says where to look. ``new`` given by name is imported when a name is
    first taken: that is how a core module that moved into a built-in plugin's folder keeps its old path
    without the core importing the plugins.
    """
    new_name = new if isinstance(new, str) else new.__name__
    use = use or new_name

    def getattr_(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r} (it is a deprecated alias of "
                                 f"{new_name!r}; import from {use!r})")
        warnings.warn(f"'{old}.{name}' moved to '{new_name}.{name}': import it from '{use}'"
                      f"{' (the stable plugin API)' if use == 'specmoe.plugin_api' else ''}; the alias '{old}' will "
                      f"be removed in specmoe {REMOVED_IN}",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new) if isinstance(new, str) else new, name)

    return getattr_, lambda: sorted(names)
