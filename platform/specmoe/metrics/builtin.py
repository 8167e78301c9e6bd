# SPDX-License-Identifier: Apache-2.0
"""The built-in metrics (Spec-Bench definitions; EcoSpec's E, bytes and latency breakdown). ``E`` counts experts of
the *verified* tokens (the paper's E); ``E_pass`` of every token of the ``[batch, width]`` verification pass,
padding and finished rows included (= ``E`` at batch size 1); ``expert_bytes_per_step`` uses ``E_pass``."""

from __future__ import annotations

from specmoe.metrics.registry import CellData, Metric, mean, register

__all__: list[str] = []


def _layers_mean(per_layer: list[int] | None) -> float | None:
    return sum(per_layer) / len(per_layer) if per_layer else None


def _step_mean(key: str):
    return lambda d: mean(s[key] for s in d.steps if s.get(key) is not None)


def _e(d: CellData) -> float | None:
    return mean(v for v in (_layers_mean(s.get("experts_per_layer")) for s in d.steps) if v is not None)


def _e_pass(d: CellData) -> float | None:
    vals = (_layers_mean(s.get("pass_experts_per_layer") or s.get("experts_per_layer")) for s in d.steps)
    return mean(v for v in vals if v is not None)


def _e_pred(d: CellData) -> float | None:
    return mean(v for v in (_layers_mean(s.get("predicted_per_layer")) for s in d.steps) if v is not None)


def _bytes(per_expert: str):
    def compute(d: CellData) -> float | None:
        e, size = _e_pass(d), getattr(d, per_expert)
        return None if e is None or not size else e * d.num_moe_layers * size
    return compute


def _tokens_per_s(d: CellData) -> float | None:
    return mean(b.new_tokens / b.seconds for b in d.batches if b.seconds > 0)


def _pred_acc(d: CellData) -> float | None:
    total = sum(s.get("pred_total", 0) for s in d.steps)
    return sum(s.get("pred_hits", 0) for s in d.steps) / total if total else None


def _speedup(cell: CellData, ar: CellData, m: dict[str, float], a: dict[str, float]) -> float | None:
    if not a.get("tokens_per_s") or "tokens_per_s" not in m:
        return None
    return m["tokens_per_s"] / a["tokens_per_s"]


def _rho(cell: CellData, ar: CellData, m: dict[str, float], a: dict[str, float]) -> float | None:
    return a["t_total"] / m["t_verify"] if m.get("t_verify") and "t_total" in a else None


def _matches_ar(cell: CellData, ar: CellData, m: dict[str, float], a: dict[str, float]) -> float | None:
    if cell.temperature != 0 or not cell.outputs or len(cell.outputs) != len(ar.outputs):
        return None
    return sum(o == r for o, r in zip(cell.outputs, ar.outputs)) / len(cell.outputs)


for _m in (
    Metric("speedup", "Spd", "x", "tokens/s of the method over tokens/s of AR on the same prompts, same run",
           "ratio of the batches means of tokens/s", relative=_speedup, ar_value=1.0),
    Metric("alpha", "α", "tokens", "tokens appended per step: accepted drafts + the bonus token", "rows",
           compute=lambda d: mean(a for s in d.steps for a in s["accepted"]), applies_to_ar=False, ar_value=1.0),
    Metric("E", "E", "experts", "unique experts per MoE layer activated by the verified tokens (union over "
           "the batch)", "steps", compute=_e),
    Metric("E_pass", "E_pass", "experts", "unique experts per MoE layer over every token of the verification "
           "pass (padding and finished rows included)", "steps", compute=_e_pass),
    Metric("E_pred", "E_pred", "experts", "unique experts per layer predicted for the verified nodes", "steps",
           compute=_e_pred, applies_to_ar=False),
    Metric("expert_bytes_per_step", "bytes/step", "bytes", "E_pass x MoE layers x bytes per expert at the "
           "checkpoint's stored precision (expert weights read per step, as the paper's Table 2 counts them)",
           "steps", compute=_bytes("bytes_per_expert")),
    Metric("expert_bytes_per_step_loaded", "bytes/step (loaded)", "bytes", "E_pass x MoE layers x bytes per "
           "expert as loaded (e.g. MXFP4 dequantized to bf16)", "steps", compute=_bytes("bytes_per_expert_loaded")),
    Metric("t_pred", "T_pred", "s", "expert prediction time per step", "steps", compute=_step_mean("t_pred"),
           applies_to_ar=False),
    Metric("t_draft", "T_draft", "s", "drafting time per step", "steps", compute=_step_mean("t_draft"),
           applies_to_ar=False),
    Metric("t_select", "T_select", "s", "selection time per step", "steps", compute=_step_mean("t_select"),
           applies_to_ar=False),
    Metric("t_verify", "T_verify", "s", "target verification pass per step", "steps",
           compute=_step_mean("t_verify"), applies_to_ar=False),
    Metric("t_total", "T_total", "s", "whole step (AR: one token)", "steps", compute=_step_mean("t_total")),
    Metric("rho", "ρ", "x", "T_total of AR (one token) over T_verify of the method", "ratio of step means",
           relative=_rho, applies_to_ar=False),
    Metric("tokens_per_s", "tok/s", "tokens/s", "new tokens over wall time of each prompt batch, all turns",
           "batches", compute=_tokens_per_s),
    Metric("predictor_accuracy", "pred acc", "fraction", "top-K overlap of predicted and routed experts of the "
           "verified tokens", "total", compute=_pred_acc, applies_to_ar=False),
    Metric("matches_ar", "= AR", "fraction", "prompts whose output equals AR token for token (T = 0 only)",
           "prompts", relative=_matches_ar, applies_to_ar=False),
    Metric("ar_steps", "AR steps", "fraction", "share of steps taken as plain AR steps under the AR floor of an "
           "adaptive selector (no drafting, prediction or selection)", "steps",
           compute=lambda d: mean(float(not s.get("speculative", True)) for s in d.steps), applies_to_ar=False),
    Metric("steps", "steps", "count", "verification steps (target passes after the prompt)", "total",
           compute=lambda d: float(len(d.steps))),
    Metric("new_tokens", "tokens", "count", "generated tokens, all prompts and turns", "total",
           compute=lambda d: float(sum(len(o) for o in d.outputs)) if d.outputs else
           float(sum(b.new_tokens for b in d.batches))),
):
    register(_m)
