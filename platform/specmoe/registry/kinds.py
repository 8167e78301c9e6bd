# SPDX-License-Identifier: Apache-2.0
"""One registry per component kind. Importing this module imports no plugin and no torch."""

from __future__ import annotations

from specmoe.registry.registry import ModuleRegistry, Registry

__all__ = ["targets", "drafters", "selectors", "predictors", "verifiers", "datasets", "stages", "benches", "commands",
           "KINDS", "registry_for"]

targets: Registry = Registry("target", "specmoe.interfaces.target:Target")
drafters: Registry = Registry("drafter", "specmoe.interfaces.drafter:Drafter")
selectors: Registry = Registry("selector", "specmoe.interfaces.selector:Selector")
predictors: Registry = Registry("predictor", "specmoe.interfaces.predictor:Predictor")
verifiers: Registry = Registry("verifier", "specmoe.interfaces.verifier:Verifier")
datasets: Registry = Registry("dataset", "specmoe.interfaces.dataset:Dataset")
stages: Registry = Registry("stage", "specmoe.interfaces.stage:Stage")

#: benchmarks (``platform bench <name>``): modules with ``add_arguments(parser)`` and ``run(args)``, declared in the
#: entry-point group ``specmoe.benches`` (the built-in ones too)
benches: ModuleRegistry = ModuleRegistry("bench", "specmoe.benches", ("add_arguments", "run"))

#: plugin subcommands of the ``platform`` CLI (``platform <name> ...``): modules with ``add_parser(subparsers)``
#: and ``run(args)``, declared in the entry-point group ``specmoe.commands`` (the core's are in
#: :data:`specmoe.cli.main.SUBCOMMANDS`)
commands: ModuleRegistry = ModuleRegistry("command", "specmoe.commands", ("add_parser", "run"))

#: the component kinds (benchmarks are modules, not components: see :func:`registry_for`)
KINDS: dict[str, Registry] = {r.kind: r for r in (targets, drafters, selectors, predictors, verifiers,
                                                  datasets, stages)}


def registry_for(kind: str) -> Registry:
    """The registry of ``kind`` (singular or plural: ``selector`` or ``selectors``; ``bench`` or ``benches``)."""
    every = {**KINDS, benches.kind: benches}
    key = kind[:-1] if kind.endswith("s") and kind[:-1] in every else kind
    key = key[:-2] if key.endswith("es") and key[:-2] in every else key
    if key not in every:
        raise KeyError(f"unknown component kind '{kind}'; kinds: {', '.join(every)}")
    return every[key]
