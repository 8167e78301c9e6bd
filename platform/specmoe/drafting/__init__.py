# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias of the draft-model modules that moved into the drafter plugins' own folders (kept through
specmoe 0.2.x, removed in 0.3.0).

Until commit 634c421 this package held the EAGLE-3 / GTO / MTP internals; each module now lives in the folder of
the drafter it belongs to:

=============================  ===============================================
old module                     new module (the drafter's folder, ``<pkg>``)
=============================  ===============================================
``specmoe.drafting.eagle3_model``  ``<eagle3>.model``
``specmoe.drafting.eagle3_io``     ``<eagle3>.checkpoint``
``specmoe.drafting.eagle3_tree``   ``<eagle3>.tree``
``specmoe.drafting.eagle3_ttt``    ``<eagle3>.ttt``
``specmoe.drafting.vocab_map``     ``<eagle3>.vocab_map``
``specmoe.drafting.gto``           ``<gto>.objective``
``specmoe.drafting.mtp_io``        ``<mtp>.checkpoint``
``specmoe.drafting.mtp_model``     ``<mtp>.model``
=============================  ===============================================

``<eagle3>`` is the package of the built-in ``eagle3`` drafter (``specmoe_plugins.drafters.eagle3``), and so on
(:data:`MOVED`: old module -> new module, written out as every other alias of a moved core module is; the core
still imports no plugin: the new module is imported by name only when an old one is). ``import
specmoe.drafting.<old>`` (or ``from specmoe.drafting import <old>``) gives the new module itself, with a
:class:`DeprecationWarning` naming it; importing this package warns too. The package itself exported no names
(``__all__`` was empty), so it has none here either. A plugin should reuse a drafter through the registry
(``drafters.get(<name>)``) and take the interfaces from :mod:`specmoe.plugin_api`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

__all__: list[str] = []

#: old module -> the module of the drafter plugin's folder that replaced it
MOVED = {
    "specmoe.drafting.eagle3_model": "specmoe_plugins.drafters.eagle3.model",
    "specmoe.drafting.eagle3_io": "specmoe_plugins.drafters.eagle3.checkpoint",
    "specmoe.drafting.eagle3_tree": "specmoe_plugins.drafters.eagle3.tree",
    "specmoe.drafting.eagle3_ttt": "specmoe_plugins.drafters.eagle3.ttt",
    "specmoe.drafting.vocab_map": "specmoe_plugins.drafters.eagle3.vocab_map",
    "specmoe.drafting.gto": "specmoe_plugins.drafters.gto.objective",
    "specmoe.drafting.mtp_io": "specmoe_plugins.drafters.mtp.checkpoint",
    "specmoe.drafting.mtp_model": "specmoe_plugins.drafters.mtp.model",
}
_REMOVAL = "specmoe 0.3.0"

warnings.warn(f"'{__name__}' is deprecated: its modules moved into the drafter plugins' folders "
              f"(e.g. '{__name__}.mtp_model' -> the 'mtp' drafter's package '.model'; see the docstring of "
              f"'{__name__}'); this alias will be removed in {_REMOVAL}", DeprecationWarning, stacklevel=2)


def new_module_name(old: str) -> str:
    """The full name of the module that replaced ``specmoe.drafting.<old>``."""
    return MOVED[f"{__name__}.{old}"]


def _warn_at_importer(message: str) -> None:
    """Warn as if from the line that imported the alias: the first frame outside this file and the import
    machinery (how deep that is depends on the import form, so it is looked up, not counted)."""
    frame = sys._getframe(1)
    while frame.f_back is not None and (frame.f_code.co_filename == __file__
                                        or "importlib" in frame.f_code.co_filename):
        frame = frame.f_back
    glob = frame.f_globals
    warnings.warn_explicit(message, DeprecationWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=glob.get("__name__"), registry=glob.setdefault("__warningregistry__", {}))


def _resolve(old: str) -> ModuleType:
    new = new_module_name(old)
    _warn_at_importer(f"'{__name__}.{old}' moved to '{new}'; reuse the drafter through the registry "
                      f"(specmoe.registry.drafters) or import '{new}'; the alias will be removed in {_REMOVAL}")
    return importlib.import_module(new)


class _AliasLoader(importlib.abc.Loader):
    """Loads ``specmoe.drafting.<old>`` as the new module itself (it replaces itself in ``sys.modules``)."""

    def __init__(self, old: str) -> None:
        self.old = old

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        # the import machinery returns whatever sys.modules holds under the name once this returns
        sys.modules[module.__name__] = _resolve(self.old)


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds exactly the moved submodules of this package (every other name is left to the other finders)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(fullname.rpartition(".")[2]))


# once per process, also when this package is imported again (a test that clears sys.modules)
if not any(type(f).__qualname__ == "_AliasFinder" and type(f).__module__ == __name__ for f in sys.meta_path):
    sys.meta_path.append(_AliasFinder())


def __getattr__(name: str) -> Any:
    if f"{__name__}.{name}" in MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r} (a deprecated alias; see its docstring "
                         f"for where its modules moved)")
