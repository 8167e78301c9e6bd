# SPDX-License-Identifier: Apache-2.0
"""Typed option values shared by plugin ``Config`` s (validated by ``platform validate``)."""

from __future__ import annotations

from enum import Enum
from typing import Any, Optional

import torch

__all__ = ["DType", "torch_dtype"]


class DType(str, Enum):
    """A floating-point dtype option: ``float32``, ``bfloat16``, ``float16`` (aliases ``fp32``, ``bf16``, ``fp16``)."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"
    fp32 = "float32"
    bf16 = "bfloat16"
    fp16 = "float16"

    @classmethod
    def _missing_(cls, value: Any) -> Optional[DType]:
        if isinstance(value, str) and value in cls.__members__:  # an alias given by name
            return cls.__members__[value]
        return None

    @property
    def torch(self) -> torch.dtype:
        return getattr(torch, self.value)

    @classmethod
    def spellings(cls) -> list[str]:
        """Every accepted spelling, canonical names first."""
        return [m.value for m in cls] + [n for n in cls.__members__ if n not in {m.value for m in cls}]


def torch_dtype(value: DType | str | None, default: torch.dtype | None = None,
                where: str = "dtype") -> torch.dtype | None:
    """``value`` (a :class:`DType`, a spelling, or ``None``: ``default``) as a ``torch.dtype``; ``ValueError``
    (naming the option ``where``) for anything else."""
    if value is None:
        return default
    try:
        return DType(value).torch
    except ValueError:
        raise ValueError(f"{where} '{value}' is not one of {', '.join(DType.spellings())}") from None
