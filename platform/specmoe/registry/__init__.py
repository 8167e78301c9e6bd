# SPDX-License-Identifier: Apache-2.0
"""Plugin registries (see :mod:`specmoe.registry.registry`)."""

from specmoe.registry.kinds import (
                                    KINDS,
                                    benches,
                                    commands,
                                    datasets,
                                    drafters,
                                    predictors,
                                    registry_for,
                                    selectors,
                                    stages,
                                    targets,
                                    verifiers,
)
from specmoe.registry.registry import (
                                    DuplicatePluginError,
                                    ModuleRegistry,
                                    Registry,
                                    RegistryError,
                                    UnknownPluginError,
                                    import_object,
                                    normalize_name,
)

__all__ = ["KINDS", "Registry", "ModuleRegistry", "benches", "commands", "RegistryError", "UnknownPluginError",
           "DuplicatePluginError", "targets", "drafters", "selectors", "predictors", "verifiers", "datasets", "stages",
           "registry_for", "import_object", "normalize_name"]
