# SPDX-License-Identifier: Apache-2.0
"""The drafter a benchmark runs: a registered drafter from ``--drafter`` / ``--drafter-path`` (shared by the
benches that generate: ``tree``, ``peer`` and the plugins' ``goodput``)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specmoe.interfaces.drafter import Drafter
    from specmoe.interfaces.target import Target

__all__ = ["bench_drafter", "can_share_target"]


def bench_drafter(target: Target, args: argparse.Namespace) -> Drafter:
    """``args.drafter`` set up on ``target``: from ``args.drafter_path`` when given, else drafting with the target
    itself where the drafter has a ``share_target`` option, else untrained (seed 0)."""
    from specmoe.registry import drafters

    cls = drafters.get(args.drafter)
    if args.drafter_path:
        d = cls(path=args.drafter_path)
    elif can_share_target(cls):  # a drafter that can draft with the target itself needs no weights of its own
        d = cls(share_target=True)
    else:
        d = cls(init={"seed": 0})
    d.setup(target)
    return d


def can_share_target(cls: type) -> bool:
    """Whether a drafter plugin's ``Config`` has a ``share_target`` option (draft with the target's own weights)."""
    config = getattr(cls, "Config", None)
    return dataclasses.is_dataclass(config) and any(f.name == "share_target" for f in dataclasses.fields(config))
