# SPDX-License-Identifier: Apache-2.0
"""Union verifiers (``torch_union``, ``triton_union``) against the model's own ``eager`` experts, in fp32.

Module level (edge cases of routing) and full tiny-model logits, for GPT-OSS, Qwen3-MoE and DeepSeek-V3.
The Triton checks run in one subprocess with ``TRITON_INTERPRET=1`` (the interpreter must be chosen before
the kernels are built, and this pytest process must keep compiled kernels for the GPU tests); that
subprocess runs this file as a script and reports every comparison as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

ARCHS = ["gpt_oss", "qwen3_moe", "deepseek_v3"]
CASES = ["one_token", "one_set_16", "one_set_17", "one_set_64", "all_distinct", "k_gt_t", "full_union",
         "unsorted_rows", "sentinel", "random_24"]
#: fp32 tolerance relative to the largest reference magnitude
REL_TOL = {"torch_union": 1e-6, "triton_union": 3e-6}


# ---------------------------------------------------------------- fixtures shared with the subprocess
def build_model(arch: str, dtype: torch.dtype = torch.float32):
    """A tiny random model; GPT-OSS gets non-zero biases and scaled weights so that its clamp is active."""
    import transformers

    from specmoe.models.tiny import ARCHITECTURES, tiny_config

    torch.manual_seed(0)
    model = getattr(transformers, ARCHITECTURES[arch][1])(tiny_config(arch)).eval().requires_grad_(False)
    if arch == "gpt_oss":
        g = torch.Generator().manual_seed(1)
        for layer in model.model.layers:
            ex = layer.mlp.experts
            ex.gate_up_proj.mul_(4.0)
            ex.gate_up_proj_bias.copy_(torch.randn(ex.gate_up_proj_bias.shape, generator=g))
            ex.down_proj_bias.copy_(0.5 * torch.randn(ex.down_proj_bias.shape, generator=g))
    return model.to(dtype)


def experts_module(model):
    return next(layer.mlp.experts for layer in model.model.layers if hasattr(layer.mlp, "experts"))


def _rows(t: int, k: int, e: int, g: torch.Generator) -> torch.Tensor:
    return torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])


def case_inputs(arch: str, case: str, module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(hidden [T, H], top_k_index [T, K], top_k_weights [T, K])`` of one routing edge case."""
    from specmoe_plugins.verifiers.union.layout import experts_layout

    lay = experts_layout(module)
    e, k = lay.num_experts, {"gpt_oss": 2, "qwen3_moe": 2, "deepseek_v3": 4}[arch]
    g = torch.Generator().manual_seed(zlib.crc32(f"{arch}/{case}".encode()))
    if case == "one_token":
        idx = _rows(1, k, e, g)
    elif case.startswith("one_set_"):
        t = int(case.rsplit("_", 1)[1])
        base = torch.randperm(e, generator=g)[:k]
        idx = torch.stack([base[torch.randperm(k, generator=g)] for _ in range(t)])  # same set, any order
    elif case == "all_distinct":
        idx = torch.randperm(e, generator=g)[: (e // k) * k].view(e // k, k)
    elif case == "k_gt_t":
        idx = _rows(2, min(8, e), e, g)
    elif case == "full_union":
        idx = _rows(64, k, e, g)
    elif case == "unsorted_rows":
        idx = _rows(12, k, e, g).sort(dim=1, descending=True).values
    elif case in ("sentinel", "random_24"):
        idx = _rows(24 if case == "random_24" else 10, k, e, g)
    else:
        raise KeyError(case)
    t, kk = idx.shape
    w = torch.rand(t, kk, generator=g) + 0.05
    scale = 2.5 if arch == "deepseek_v3" else 1.0  # DeepSeek: fp32 weights summing to routed_scaling_factor
    w = (w / w.sum(dim=1, keepdim=True) * scale).float()
    if case == "sentinel":  # expert-parallel sentinels: id E, weight 0
        drop = torch.rand(t, kk, generator=g) < 0.3
        idx = idx.masked_fill(drop, e)
        w = w.masked_fill(drop, 0.0)
    hidden = 2.0 * torch.randn(t, lay.hidden, generator=g)
    return hidden.to(module.gate_up_proj.dtype), idx, w


def eager_reference(model, module, hidden, idx, w) -> torch.Tensor:
    """The model's own loop; sentinel slots become an unused expert with weight 0 (eager cannot index E)."""
    e = module.gate_up_proj.shape[0]
    idx = idx.clone()
    for row in idx:
        bad = row >= e
        if bool(bad.any()):
            spare = [x for x in range(e) if x not in row.tolist()]
            row[bad] = torch.tensor(spare[: int(bad.sum())])
    prev = model.get_experts_implementation()
    model.set_experts_implementation("eager")
    try:
        return module(hidden, idx, w)
    finally:
        model.set_experts_implementation(prev)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).abs().max() / ref.double().abs().max().clamp(min=1e-30))


def logits_with(model, impl: str, ids: torch.Tensor) -> torch.Tensor:
    prev = model.get_experts_implementation()
    model.set_experts_implementation(impl)
    try:
        with torch.no_grad():
            return model(ids).logits
    finally:
        model.set_experts_implementation(prev)


def run_report(verifier_name: str) -> dict[str, dict]:
    """Every module-level case and the full-model logits of ``verifier_name`` vs eager, for all archs."""
    from specmoe.registry import verifiers

    verifier = verifiers.get(verifier_name)()
    verifier.register()
    report: dict[str, dict] = {}
    for arch in ARCHS:
        model = build_model(arch)
        module = experts_module(model)
        for case in CASES:
            hidden, idx, w = case_inputs(arch, case, module)
            ref = eager_reference(model, module, hidden, idx, w)
            out = verifier.experts_forward(module, hidden, idx, w)
            again = verifier.experts_forward(module, hidden, idx, w)
            report[f"{arch}/{case}"] = dict(err=rel_err(out, ref), dtype=str(out.dtype),
                                           shape=list(out.shape), deterministic=bool(torch.equal(out, again)),
                                           identical=bool(torch.equal(out, ref)))
        ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(3))
        ref = logits_with(model, "eager", ids)
        out = logits_with(model, verifier.implementation_name(), ids)
        report[f"{arch}/logits"] = dict(err=rel_err(out, ref), dtype=str(out.dtype), shape=list(out.shape),
                                        deterministic=True, identical=bool(torch.equal(out, ref)))
    return report


def interpreter_bf16_error() -> str:
    """The message raised for a bf16 model under the CPU interpreter (empty if nothing was raised)."""
    from specmoe.errors import UserError
    from specmoe.registry import verifiers

    model = build_model("qwen3_moe", torch.bfloat16)
    module = experts_module(model)
    hidden, idx, w = case_inputs("qwen3_moe", "one_token", module)
    try:
        verifiers.get("triton_union")().experts_forward(module, hidden, idx, w.to(torch.bfloat16))
    except UserError as exc:
        return str(exc)
    return ""


# ---------------------------------------------------------------- torch_union (in process)
@pytest.fixture(scope="module")
def torch_report():
    torch.set_num_threads(1)
    return run_report("torch_union")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES + ["logits"])
def test_torch_union_matches_eager(torch_report, arch, case):
    r = torch_report[f"{arch}/{case}"]
    assert r["dtype"] == "torch.float32"
    assert r["err"] <= REL_TOL["torch_union"], r


@pytest.mark.parametrize("arch", ARCHS)
def test_torch_union_is_deterministic_in_fp32(torch_report, arch):
    """The same call twice gives the same bits (one thread). Bit-identity with the model's eager loop is not
    asserted: it holds on some CPUs and not on others (BLAS picks kernels by shape, alignment and ISA), so the
    comparison with eager is the relative tolerance of :func:`test_torch_union_matches_eager`."""
    for case in CASES:
        r = torch_report[f"{arch}/{case}"]
        assert r["deterministic"], (case, r)


@pytest.mark.parametrize("arch", ARCHS)
def test_torch_union_strategies_match_eager(arch):
    """Both ways of running the union's matmuls (``grouped_mm`` and the per-expert loop) on every case."""
    from specmoe.registry import verifiers

    model = build_model(arch)
    module = experts_module(model)
    for strategy in ("grouped", "loop"):
        verifier = verifiers.get("torch_union")(strategy=strategy)
        for case in CASES:
            hidden, idx, w = case_inputs(arch, case, module)
            ref = eager_reference(model, module, hidden, idx, w)
            err = rel_err(verifier.experts_forward(module, hidden, idx, w), ref)
            assert err <= REL_TOL["torch_union"], (strategy, case, err)


def test_cases_cover_the_routing_edge_cases():
    model = build_model("deepseek_v3")
    module = experts_module(model)
    e = module.gate_up_proj.shape[0]
    _, idx, w = case_inputs("deepseek_v3", "all_distinct", module)
    assert idx.unique().numel() == idx.numel() == e
    _, idx, _ = case_inputs("deepseek_v3", "k_gt_t", module)
    assert idx.shape[1] > idx.shape[0]
    _, idx, _ = case_inputs("deepseek_v3", "full_union", module)
    assert idx.unique().numel() == e
    _, idx, w = case_inputs("deepseek_v3", "one_set_17", module)
    assert idx.shape[0] == 17 and idx.unique().numel() == idx.shape[1]
    assert w.dtype == torch.float32 and torch.allclose(w.sum(dim=1), torch.full((17,), 2.5))
    _, idx, w = case_inputs("deepseek_v3", "unsorted_rows", module)
    assert bool((idx[:, 1:] < idx[:, :-1]).all())
    _, idx, w = case_inputs("deepseek_v3", "sentinel", module)
    assert bool((idx == e).any()) and bool((w[idx == e] == 0).all())


@pytest.mark.parametrize("t,k,e", [(1, 4, 16), (5, 2, 8), (16, 4, 16), (3, 8, 256)])
def test_routing_meta_groups_slots_by_expert(t, k, e):
    from specmoe_plugins.verifiers.union.routing_meta import routing_meta

    g = torch.Generator().manual_seed(t * 1000 + e)
    idx = _rows(t, k, e, g)
    idx[torch.rand(t, k, generator=g) < 0.2] = e  # sentinels
    meta = routing_meta(idx, e)
    flat = idx.reshape(-1)
    u_max = min(e, t * k)
    assert meta.perm.shape == (t * k,) and meta.u_expert.shape == meta.u_count.shape == (u_max,)
    used = meta.u_expert >= 0
    assert meta.u_expert[used].tolist() == sorted(set(flat[flat < e].tolist()))  # the union, ascending
    assert bool((meta.u_count[~used] == 0).all()) and int(meta.u_count.sum()) == int((flat < e).sum())
    for ex, start, count in zip(meta.u_expert.tolist(), meta.u_start.tolist(), meta.u_count.tolist()):
        if ex >= 0:
            slots = meta.perm[start:start + count].long()
            assert bool((flat[slots] == ex).all()) and slots.tolist() == sorted(slots.tolist())
    other = routing_meta(_rows(t, k, e, g), e)  # shapes never depend on the routing (graph capture)
    assert [x.shape for x in (other.perm, other.u_expert, other.u_start, other.u_count)] == \
        [x.shape for x in (meta.perm, meta.u_expert, meta.u_start, meta.u_count)]


def test_gpt_oss_clamp_is_exercised():
    model = build_model("gpt_oss")
    module = experts_module(model)
    hidden, idx, _ = case_inputs("gpt_oss", "random_24", module)
    used = idx.unique()
    h = torch.einsum("th,ehc->tec", hidden, module.gate_up_proj[used]) + module.gate_up_proj_bias[used]
    gate, up = h[..., 0::2], h[..., 1::2]
    frac = float(((gate > module.limit).float().mean() + (up.abs() > module.limit).float().mean()) / 2)
    assert 0.05 < frac < 0.95, frac


@pytest.mark.parametrize("arch", ARCHS)
def test_torch_union_bf16_keeps_dtype_and_is_as_accurate_as_eager(arch):
    gold_model = build_model(arch)
    model = build_model(arch, torch.bfloat16)
    module, gold_module = experts_module(model), experts_module(gold_model)
    hidden, idx, w = case_inputs(arch, "random_24", gold_module)
    w_model = w if arch == "deepseek_v3" else w.bfloat16()  # DeepSeek-V3 routes with fp32 weights
    gold = eager_reference(gold_model, gold_module, hidden, idx, w)
    ref = eager_reference(model, module, hidden.bfloat16(), idx, w_model)
    from specmoe_plugins.verifiers.union.reference import union_experts_forward

    out = union_experts_forward(module, hidden.bfloat16(), idx, w_model)
    assert out.dtype == torch.bfloat16
    assert (out.float() - gold).abs().max() <= 2 * (ref.float() - gold).abs().max()
    # the union may sum the experts in fp32 and round once where eager rounds after each expert: the two agree
    # to about two bf16 ulps (measured on the three architectures: <= 7e-3 relative)
    assert rel_err(out, ref) <= 1e-2


def test_triton_on_cpu_without_interpreter_is_a_user_error():
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET"):
        pytest.skip("this process runs the Triton interpreter")
    from specmoe.errors import UserError
    from specmoe_plugins.verifiers.union.triton_verifier import TritonUnionVerifier

    model = build_model("qwen3_moe")
    module = experts_module(model)
    hidden, idx, w = case_inputs("qwen3_moe", "one_token", module)
    with pytest.raises(UserError, match="TRITON_INTERPRET=1"):
        TritonUnionVerifier().experts_forward(module, hidden, idx, w)


def test_missing_triton_is_a_missing_extra_error(monkeypatch):
    from specmoe.errors import MissingExtraError
    from specmoe_plugins.verifiers.union.triton_verifier import TritonUnionVerifier

    monkeypatch.setitem(sys.modules, "triton", None)  # what an environment without the extra looks like
    with pytest.raises(MissingExtraError, match=r"specmoe\[triton\]"):
        TritonUnionVerifier().kernels()


def test_triton_large_token_count_uses_the_torch_union_path():
    from specmoe_plugins.verifiers.union.triton_verifier import TritonUnionVerifier

    model = build_model("deepseek_v3")
    module = experts_module(model)
    hidden, idx, w = case_inputs("deepseek_v3", "full_union", module)  # T = 64
    out = TritonUnionVerifier(max_tokens=32).experts_forward(module, hidden, idx, w)  # never imports triton
    assert rel_err(out, eager_reference(model, module, hidden, idx, w)) <= REL_TOL["torch_union"]


# ---------------------------------------------------------------- triton_union (interpreter subprocess)
@pytest.fixture(scope="module")
def triton_report(tmp_path_factory):
    pytest.importorskip("triton")
    out = tmp_path_factory.mktemp("triton") / "report.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES + ["logits"])
def test_triton_union_matches_eager(triton_report, arch, case):
    r = triton_report["cases"][f"{arch}/{case}"]
    assert r["dtype"] == "torch.float32"
    assert r["err"] <= REL_TOL["triton_union"], r
    assert r["deterministic"], "two runs must be bitwise equal"


def test_triton_interpreter_rejects_bf16(triton_report):
    assert "float32 only" in triton_report["bf16_error"]


if __name__ == "__main__":  # the interpreter subprocess: python test_verifier_numerics.py REPORT.json
    torch.set_num_threads(1)
    from specmoe_plugins.verifiers.union import kernels as union_moe

    if not union_moe.is_interpreted():
        sys.exit("TRITON_INTERPRET=1 must be set for this script")
    result = {"cases": run_report("triton_union"), "bf16_error": interpreter_bf16_error()}
    Path(sys.argv[1]).write_text(json.dumps(result))
