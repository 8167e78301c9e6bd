# SPDX-License-Identifier: Apache-2.0
"""Building the plugins that a stage's component options (``component("target", name_default="hf")``) name.

Such an option holds a :class:`~specmoe.config.schema.Component`, or in a stage built in code a mapping
``{name: <key>, <options>}`` whose ``name`` defaults to the field's ``name_default``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

from specmoe.config.schema import Component
from specmoe.errors import UserError

if TYPE_CHECKING:
    from specmoe.interfaces.target import Target

__all__ = ["as_component", "build_option", "build_target", "option_components"]


def as_component(value: Any, kind: str, where: str, name_default: Optional[str] = None) -> Component:
    """``value`` (a :class:`Component` or a mapping ``{name: ..., <options>}``) as a :class:`Component`."""
    if isinstance(value, Component):
        return value
    if not isinstance(value, Mapping):
        raise UserError(f"{where}: a {kind} is {{name: <{kind}>, <options>}}, got {value!r}")
    options = dict(value)
    name = options.pop("name", None) or name_default
    if not name:
        raise UserError(f"{where}: a {kind} needs 'name' (see 'platform ls {kind}'), got {value!r}")
    return Component(str(name), options, kind)


def _field(config: Any, name: str) -> dataclasses.Field:
    for f in dataclasses.fields(config):
        if f.name == name:
            return f
    raise AttributeError(f"{type(config).__qualname__} has no option '{name}'")


def _where(config: Any, name: str) -> str:
    """``<Stage>.<option>`` for messages (``GenerateResponses.target``)."""
    return f"{type(config).__qualname__.split('.')[0]}.{name}"


def build_option(config: Any, name: str, **overrides: Any) -> Any:
    """Build option ``name``'s plugin of stage ``config`` (``overrides`` win); UserError if unset or not a component."""
    f = _field(config, name)
    kind = f.metadata.get("kind", "")
    where = _where(config, name)
    value = getattr(config, name)
    if value is None:
        raise UserError(f"{where}: set the {kind} ({{name: <{kind}>, <options>}})")
    comp = as_component(value, kind, where, f.metadata.get("name_default"))
    return comp.build(**overrides)


def build_target(config: Any, name: str = "target", device: Optional[str] = None) -> Target:
    """The :class:`Target` of option ``name``; ``device`` applies when its options set no ``device``/``device_map``."""
    f = _field(config, name)
    comp = as_component(getattr(config, name), "target", _where(config, name), f.metadata.get("name_default"))
    overrides = {}
    if device is not None and comp.options.get("device") is None and not comp.options.get("device_map"):
        overrides["device"] = str(device)
    return build_option(config, name, **overrides)


def option_components(config: Any, name: str) -> list[Component]:
    """The components held by option ``name`` (one component, a list of them, or unset: ``[]``)."""
    f = _field(config, name)
    kind = f.metadata.get("kind", "")
    value = getattr(config, name)
    if value is None:
        return []
    where = _where(config, name)
    values = value if isinstance(value, (list, tuple)) else [value]
    return [as_component(v, kind, f"{where}[{i}]", f.metadata.get("name_default")) for i, v in enumerate(values)]
