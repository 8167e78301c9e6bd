# SPDX-License-Identifier: Apache-2.0
"""Deprecated alias (kept through specmoe 0.2.x, removed in 0.3.0): the pretraining LightningModule of the tiny target
moved into the trained tiny target's folder, ``specmoe_plugins.targets.tiny.module``. Every name taken from here is
that module's object, with a :class:`DeprecationWarning`; the core imports it only then (by name)."""

from __future__ import annotations

from specmoe.utils.deprecation import moved_names

__all__ = ["PretrainLM", "DEFAULT_BALANCE_RATE", "build_hf_config", "num_experts_of",  # noqa: F822
           "evaluate_blocks", "TRAIN_EXPERTS", "sorted_loop_experts_forward"]

__getattr__, __dir__ = moved_names(__name__, "specmoe_plugins.targets.tiny.module", __all__, use=None)
