# SPDX-License-Identifier: Apache-2.0
"""Recipe loading (YAML + ``base:`` + dotlist overrides) and validation against typed schemas."""

from specmoe.config.errors import ConfigError, Problem
from specmoe.config.load import load_recipe
from specmoe.config.schema import Component, DecodingConfig, EvalConfig, MethodConfig, RunConfig, StageSpec

__all__ = ["ConfigError", "Problem", "load_recipe", "RunConfig", "Component", "DecodingConfig",
           "EvalConfig", "MethodConfig", "StageSpec"]
