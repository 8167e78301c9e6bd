# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias of :mod:`specmoe_plugins.selectors.goodput.bench`: ``platform bench goodput`` moved into the
goodput selector's folder (issue 24.1) and is found through the entry-point group ``specmoe.benches``. Its names
still work, with a :class:`DeprecationWarning`, until :data:`specmoe.utils.deprecation.REMOVED_IN`; the new
module is named, not imported (the core imports no plugin). ``_drafter`` is
:func:`specmoe.bench.drafters.bench_drafter` (kept here, without a warning, for the benches that import it)."""

from __future__ import annotations

from specmoe.bench.drafters import bench_drafter as _drafter  # noqa: F401 - imported by bench tree / peer
from specmoe.bench.drafters import can_share_target as _can_share_target  # noqa: F401
from specmoe.utils.deprecation import moved_names

_NEW = "specmoe_plugins.selectors.goodput.bench"
_NAMES = ["add_arguments", "run", "measure"]
__all__ = list(_NAMES)  # served by __getattr__

__getattr__, __dir__ = moved_names(__name__, _NEW, __all__, use=_NEW)
