# SPDX-License-Identifier: Apache-2.0
"""Dataset interface: evaluation or training prompts."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from specmoe.interfaces.plugin import Plugin

__all__ = ["Dataset", "Sample"]


@dataclass
class Sample:
    """One benchmark item.

    Attributes:
        id: stable identifier within the dataset.
        turns: user turns (single-turn benchmarks have one; a later turn sees the model's previous answers).
        chat: render with the target's chat template (else ``turns[0]`` is a raw completion prompt).
        reference: gold answer if the benchmark has one.
        meta: anything else (category, difficulty...).
    """

    id: str
    turns: list[str]
    chat: bool = False
    reference: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


class Dataset(Plugin, ABC):
    """Loads benchmark samples (from a path, ``SPECMOE_DATA_DIR``, or the hub)."""

    @abstractmethod
    def load(self) -> list[Sample]:
        """All selected samples (after ``limit`` / seeded subset selection)."""
