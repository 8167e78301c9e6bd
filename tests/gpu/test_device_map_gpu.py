# SPDX-License-Identifier: Apache-2.0
"""A tiny target split over ``cuda:0`` and the CPU with an explicit ``device_map`` (embedding and the first half
of the layers on the GPU, the rest, the final norm and the LM head on the CPU): greedy speculative decoding
equals autoregressive decoding for every drafter (routing, drafter features, logits, masks and the sampling
generator cross devices), and every output is returned on ``target.device``."""

from __future__ import annotations

import pytest
import torch
from fixtures.multidevice import check_every_drafter, device_map

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("arch", ["gpt_oss", "qwen3_moe", "deepseek_v3"])
def test_split_target_decodes_losslessly(arch, tmp_path):
    pytest.importorskip("accelerate")
    multi = check_every_drafter(arch, device_map(arch, "cuda:0", "cpu"), tmp_path)
    assert multi["draft_model/self"] > 0, "self-drafting must accept multi-token paths"
