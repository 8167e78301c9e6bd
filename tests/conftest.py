# SPDX-License-Identifier: Apache-2.0
"""Shared pytest setup: fixture modules, the gpu marker auto-skip, every test starting from the same seeds."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
pytest_plugins = ["fixtures.tiny", "fixtures.agreeing", "fixtures.traces"]

#: eager decoding passes unless a test asks for compiled ones (the ``compiled`` fixture below); set at import so
#: that session and module fixtures building targets see it too
os.environ["SPECMOE_COMPILE"] = "0"

#: the benchmark data beside the repository (CI has it at the same relative path)
DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(autouse=True, scope="session")
def _private_user_cache(tmp_path_factory):
    """Tests write no user cache of the machine (e.g. the ``precision: auto`` decision): ``XDG_CACHE_HOME`` is
    a fresh directory for the session."""
    import os

    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg_cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same random state, whatever ran before it: a test that draws unseeded data
    (``torch.randn`` without a generator) sees the same data in every run and in any order."""
    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture
def compiled():
    """Request it to run the test with compiled decoding passes (``SPECMOE_COMPILE=1``, the product's default);
    every other test runs the eager passes: each compiled target costs a compilation (tens of seconds cold),
    and ``tests/unit/test_compiled_{pass,draft}.py`` hold the compiled path to the eager one and to losslessness."""
    return True


@pytest.fixture(autouse=True)
def _compiled_passes_on_request(request, monkeypatch):
    monkeypatch.setenv("SPECMOE_COMPILE", "1" if "compiled" in request.fixturenames else "0")
    yield


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
