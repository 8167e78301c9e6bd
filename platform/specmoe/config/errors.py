# SPDX-License-Identifier: Apache-2.0
"""Recipe problems, reported all at once."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Problem", "ConfigError"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a recipe: where (file, dotted key) and what (message with a fix)."""

    file: str
    key: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: " if self.file else ""
        key = f"{self.key}: " if self.key else ""
        return f"{where}{key}{self.message}"


class ConfigError(Exception):
    """A recipe has one or more problems."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    def report(self) -> str:
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} in the recipe:"
        return "\n".join([head] + [f"  - {p}" for p in self.problems])
