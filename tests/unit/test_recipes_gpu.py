# SPDX-License-Identifier: Apache-2.0
"""The paper-scale recipes validate, and without GPUs/checkpoints they stop at once saying what is missing
(before any stage or evaluation work, and without creating a run directory)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU_RECIPES = ["gptoss_gsm8k.yaml", "gptoss_all.yaml", "qwen3_235b_all.yaml", "qwen3_235b_gsm8k.yaml",
               "deepseek_v31_all.yaml", "deepseek_v31_gsm8k.yaml",
               *sorted(f"gpu/{p.name}" for p in (REPO / "recipes" / "gpu").glob("*.yaml"))]


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_gpu_recipe_fails_fast_without_gpus(name, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = subprocess.run([sys.executable, "-m", "specmoe", "run", str(REPO / "recipes" / name),
                          f"output_dir={tmp_path}/runs", f"cache_dir={tmp_path}/cache"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "needs 8 CUDA GPU(s); this machine has 0" in out.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()
