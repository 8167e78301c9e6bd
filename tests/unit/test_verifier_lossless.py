# SPDX-License-Identifier: Apache-2.0
"""Greedy speculative decoding with each verifier equals autoregressive decoding, token for token.

Targets: the three tiny architectures (fp32). Drafter: ``draft_model`` sharing the target (high acceptance,
so multi-token verify steps happen); selectors ``confidence`` and ``ecospec`` (with ``router_on_embedding``).
The reference is ``ar_generate`` with the model's own ``eager`` experts. ``triton_union`` runs in a
subprocess under ``TRITON_INTERPRET=1`` (this file as a script), on fewer tokens because the interpreter is
slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ARCHS = ["gpt_oss", "qwen3_moe", "deepseek_v3"]
SELECTORS = ["confidence", "ecospec"]


def lossless_report(verifier_name: str, cache_dir: str, prompt_lens: list[int], new_tokens: int,
                    budgets: list[int]) -> dict[str, dict]:
    """``{arch/selector/budget/prompt: {ref, out, steps}}`` for one verifier over all archs and selectors."""
    from specmoe.decoding.ar import ar_generate
    from specmoe.decoding.engine import SpeculativeEngine
    from specmoe.decoding.stopping import StopRule
    from specmoe.registry import drafters, predictors, selectors, targets, verifiers

    report: dict[str, dict] = {}
    for arch in ARCHS:
        target = targets.get("hf")(tiny={"arch": arch, "seed": 0}, cache_dir=cache_dir)
        drafter = drafters.get("draft_model")(share_target=True)
        drafter.setup(target)
        predictor = predictors.get("router_on_embedding")()
        predictor.setup(target)
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, target.vocab_size, (n,), generator=g).tolist() for n in prompt_lens]
        prev = target.experts_implementation
        try:
            target.set_experts_implementation("eager")
            refs = [ar_generate(target, [p], temperature=0, stop=StopRule(new_tokens)).tokens
                    for p in prompts]
            verifiers.get(verifier_name)().install(target)
            for sel_name in SELECTORS:
                engine = SpeculativeEngine(target, drafter, selectors.get(sel_name)(), predictor)
                for budget in budgets:
                    for i, (p, ref) in enumerate(zip(prompts, refs)):
                        out = engine.generate([p], budget=budget, steps=3, top_k=2, temperature=0,
                                              stop=StopRule(new_tokens))
                        report[f"{arch}/{sel_name}/{budget}/{i}"] = dict(
                            ref=ref, out=out.tokens, verified=max(sum(s.verified) for s in out.steps),
                            steps=len(out.steps))
        finally:
            target.set_experts_implementation(prev)
    return report


def _check(report: dict[str, dict], key_prefix: str) -> None:
    rows = {k: v for k, v in report.items() if k.startswith(key_prefix + "/")}
    assert rows
    for key, r in rows.items():
        assert r["out"] == r["ref"], f"{key}: speculative {r['out']} != autoregressive {r['ref']}"
    # multi-token verify steps really happened (otherwise this would only test autoregression)
    assert max(r["verified"] for r in rows.values()) > 1
    assert min(r["steps"] for r in rows.values()) < len(next(iter(rows.values()))["ref"][0])


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny_targets"))


@pytest.mark.parametrize("verifier_name", ["hf", "torch_union"])
def test_lossless_in_process(cache_dir, verifier_name):
    torch.set_num_threads(1)
    report = lossless_report(verifier_name, cache_dir, prompt_lens=[11, 5], new_tokens=12, budgets=[2, 6])
    for arch in ARCHS:
        for sel in SELECTORS:
            _check(report, f"{arch}/{sel}")


@pytest.fixture(scope="module")
def triton_report(cache_dir, tmp_path_factory):
    pytest.importorskip("triton")
    out = tmp_path_factory.mktemp("triton_lossless") / "report.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), cache_dir, str(out)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("selector", SELECTORS)
def test_lossless_triton_union_interpreted(triton_report, arch, selector):
    _check(triton_report, f"{arch}/{selector}")


if __name__ == "__main__":  # the interpreter subprocess: python test_verifier_lossless.py CACHE REPORT.json
    torch.set_num_threads(1)
    from specmoe_plugins.verifiers.union import kernels as union_moe

    if not union_moe.is_interpreted():
        sys.exit("TRITON_INTERPRET=1 must be set for this script")
    result = lossless_report("triton_union", sys.argv[1], prompt_lens=[9], new_tokens=8, budgets=[4])
    Path(sys.argv[2]).write_text(json.dumps(result))
