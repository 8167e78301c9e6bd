# SPDX-License-Identifier: Apache-2.0
"""A target loaded with an explicit ``device_map`` (every entry ``cpu`` here; tests/gpu splits it over a GPU and
the CPU) decodes losslessly with every drafter, and returns every output on ``target.device``."""

from __future__ import annotations

import pytest
import torch
from fixtures.multidevice import check_every_drafter, device_map

pytest.importorskip("accelerate")


@pytest.mark.parametrize("arch", ["gpt_oss", "deepseek_v3"])
def test_device_map_of_cpu_entries_decodes_losslessly(arch, tmp_path):
    torch.set_num_threads(1)
    multi = check_every_drafter(arch, device_map(arch, "cpu", "cpu"), tmp_path)
    assert multi["draft_model/self"] > 0, "self-drafting must accept multi-token paths"


def test_device_map_needs_accelerate_named(monkeypatch, tmp_path):
    import importlib.util

    from specmoe.errors import UserError
    from specmoe.registry import targets

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    with pytest.raises(UserError, match="accelerate"):
        targets.get("hf")(tiny={"arch": "qwen3_moe"}, cache_dir=str(tmp_path), device_map="auto")
