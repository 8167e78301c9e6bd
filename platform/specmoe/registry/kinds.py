# SPDX-License-Identifier: Apache-2.0
"""One registry per component kind. Importing this module imports no plugin and no torch."""

from __future__ import annotations

from specmoe.registry.registry import Registry

__all__ = ["targets", "drafters", "selectors", "predictors", "verifiers", "datasets", "stages", "KINDS",
           "registry_for"]

targets: Registry = Registry("target", "specmoe.interfaces.target:Target")
drafters: Registry = Registry("drafter", "specmoe.interfaces.drafter:Drafter")
selectors: Registry = Registry("selector", "specmoe.interfaces.selector:Selector")
predictors: Registry = Registry("predictor", "specmoe.interfaces.predictor:Predictor")
verifiers: Registry = Registry("verifier", "specmoe.interfaces.verifier:Verifier")
datasets: Registry = Registry("dataset", "specmoe.interfaces.dataset:Dataset")
stages: Registry = Registry("stage", "specmoe.interfaces.stage:Stage")

KINDS: dict[str, Registry] = {r.kind: r for r in (targets, drafters, selectors, predictors, verifiers,
                                                  datasets, stages)}


def registry_for(kind: str) -> Registry:
    """The registry of ``kind`` (singular or plural: ``selector`` or ``selectors``)."""
    key = kind[:-1] if kind.endswith("s") and kind[:-1] in KINDS else kind
    if key not in KINDS:
        raise KeyError(f"unknown component kind '{kind}'; kinds: {', '.join(KINDS)}")
    return KINDS[key]
