# SPDX-License-Identifier: Apache-2.0
"""Shared pytest setup: fixture modules, the gpu marker auto-skip, one torch thread per test process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
pytest_plugins = ["fixtures.tiny", "fixtures.agreeing", "fixtures.traces"]

#: the benchmark data beside the repository (CI has it at the same relative path)
DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (tests/gpu run only where one is present)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
