# SPDX-License-Identifier: Apache-2.0
"""The common base of every plugin: a typed ``Config`` dataclass and construction from it."""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any, ClassVar

__all__ = ["Plugin"]


class Plugin:
    """Base class of all components: recipe options are declared as a nested ``Config`` dataclass; a recipe
    node ``{name: <key>, a: 1}`` is validated against it (unknown keys are errors) and built as
    ``cls(cls.Config(a=1))``. Plugins never receive the whole run configuration."""

    @dataclass
    class Config:
        pass

    #: one-line description shown by ``platform ls``
    description: ClassVar[str] = ""

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        if config is None:
            config = self.Config(**kwargs)
        elif kwargs:
            raise TypeError(f"{type(self).__name__}: pass either a Config or keyword arguments, not both")
        if not is_dataclass(config):
            raise TypeError(f"{type(self).__name__}: config must be a {type(self).__name__}.Config dataclass")
        self.config = config

    @classmethod
    def config_fields(cls) -> list[str]:
        return [f.name for f in fields(cls.Config)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"
