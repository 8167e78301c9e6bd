# SPDX-License-Identifier: Apache-2.0
"""The ``goodput`` selector and everything that serves only it, in one folder:

* :mod:`.selector`: :class:`~.selector.GoodputSelector` (``specmoe.selectors`` entry point ``goodput``);
* :mod:`.plan`: one plan's greedy with its one cost function (:class:`~.plan.Pricing`);
* :mod:`.cost_model`: the step cost model (verification pass shape -> seconds, online refits);
* :mod:`.calibration`: the offline calibration of that model (forced routing over a grid of pass shapes);
* :mod:`.stage`: the ``calibrate_cost`` stage (``cost_model.json`` measured on the target and this machine);
* :mod:`.bench`: ``platform bench goodput`` (goodput vs AR vs every fixed γ) and :mod:`.cost_bench`:
  ``platform bench goodput_cost`` (the calibration from the command line), both in ``specmoe.benches``.

The acceptance model stays in the core (:mod:`specmoe.decoding.acceptance_model`): every calibrated selector's
node values use it. Importing this package imports nothing heavy (the names below load on first use).
"""

from __future__ import annotations

from typing import Any

__all__ = ["GoodputSelector", "UNCALIBRATED", "CostModel", "VerifyShape"]

_WHERE = {"GoodputSelector": "selector", "UNCALIBRATED": "selector", "CostModel": "cost_model",
          "VerifyShape": "cost_model"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
