# SPDX-License-Identifier: Apache-2.0
"""One stable hash of JSON-able data: the cache keys of stages, evaluation groups, recipes and tiny models."""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["stable_hash", "canonical_json"]


def canonical_json(obj: Any) -> str:
    """``obj`` as JSON with sorted keys (values JSON cannot hold are written with ``str``)."""
    return json.dumps(obj, sort_keys=True, default=str)


def stable_hash(obj: Any, length: int = 16) -> str:
    """First ``length`` hex digits of the SHA-256 of :func:`canonical_json` ``(obj)``: the same in every process,
    machine and Python version (unlike ``hash()``); mapping order does not matter, list order does."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:length]
