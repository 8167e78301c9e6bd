# SPDX-License-Identifier: Apache-2.0
"""Loading the samples of the datasets a stage names (``dataset: {name: gsm8k, split: train, limit: 200}``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from specmoe.errors import UserError
from specmoe.interfaces.dataset import Sample

__all__ = ["load_samples"]


def load_samples(specs: Sequence[Any], where: str, data_dir: Optional[Path] = None) -> list[Sample]:
    """The samples of every dataset component of ``specs``, in order; ``where``: the option's dotted key, for
    messages; ``data_dir`` fills in datasets that set neither ``data_dir`` nor ``path``. Sample ids are prefixed
    with ``<name>/`` when two datasets would otherwise collide."""
    out: list[Sample] = []
    seen: set[str] = set()
    for i, comp in enumerate(specs):
        extra = {}
        if data_dir is not None and not comp.options.get("data_dir") and not comp.options.get("path"):
            extra["data_dir"] = str(data_dir)
        for s in comp.build(**extra).load():
            if s.id in seen:
                s.id = f"{comp.name}/{s.id}"
            if s.id in seen:
                raise UserError(f"{where}[{i}]: duplicate sample id '{s.id}' (is a dataset listed twice?)")
            seen.add(s.id)
            out.append(s)
    return out
