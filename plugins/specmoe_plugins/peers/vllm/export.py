# SPDX-License-Identifier: Apache-2.0
"""Write the policy file of the vLLM plugin (``plugins/specmoe_vllm``) from what specmoe's stages wrote.

``platform peer export-policy --token-table DIR [--cost-model FILE] [--vllm-run OUT.json] [--acceptance
a1,a2,...] --out policy.json`` reads *files* only (no stage module is imported):

* ``--token-table``: a ``build_token_table`` stage directory (``token_table.json``: ``num_layers``,
  ``num_experts``, ``top_k``, optionally ``test_acc``; ``token_table.safetensors``: ``token_ids [N]``,
  ``experts [N, L, K]``, ``fallback [L, K]``, ``token_counts [N]``) -> the policy's ``experts`` (``test_acc``, the
  table's held-out top-K accuracy, as ``experts.accuracy``: the policy prices a token's listed experts as routed
  with that probability, else as a random token's).
* ``--cost-model``: a ``calibrate_cost`` stage's (or ``platform bench expert_latency --calibrate``'s)
  ``cost_model.json`` (``format: specmoe.cost_model/1``, ``coef`` in seconds per unit of ``fixed``, ``tokens``,
  ``expert_layers``, ``kv_slots``, ``padded_tokens``, ``token_kv``) -> the policy's ``cost`` (``padded_tokens``
  folds into ``tokens``, ``token_kv`` into ``kv_slots``: a decode row verifies few tokens).
* ``--vllm-run``: the JSON ``vllm_runner.py`` (this folder) wrote for fixed draft counts (``configs`` 0..n), best
  with cells of several batch sizes: the per-step seconds of vLLM's own runs replace the cost model's ``fixed``,
  ``rows``, ``tokens``, ``draft_steps``, ``spec_pass`` and (with ``--token-table``) ``expert_layers`` terms
  (:func:`fit_vllm_steps`; the same fit without the expert term is the token-only variant's ``cost_tokens``),
  and the longest chain's per-position acceptance is the acceptance prior (conditional: P(position i | position
  i - 1)), greedy from its T = 0 cells, sampled from its T > 0 cells (without any: 0.9 x greedy).
* ``--acceptance``: the prior's per-position conditional rates given directly (default from ``--vllm-run``, else
  0.8 everywhere).

The policy file (``format: specmoe_vllm.policy/1``; read by ``specmoe_vllm.policy.load_policy``)::

    {"format": "specmoe_vllm.policy/1", "max_drafts": 5, "tolerance": 0.01,
     "cost": {"fixed": s, "rows": s, "tokens": s, "expert_layers": s, "kv_slots": s, "draft_steps": s,
              "spec_pass": s},
     "cost_tokens": {... the same terms, expert_layers 0},   # optional: the token-only variant's cost
     "acceptance": {"prior": {"greedy": [...], "sampled": [...]}, "strength": 20, "request_strength": 32},
     "experts": {"num_layers": L, "num_experts": E, "top_k": K, "fallback": [[...]] * L,
                 "token_ids": [...], "table": [[[...]] * L, ...], "token_counts": [...],
                 "accuracy": a},                  # optional (default 1: the listed experts taken as certain)
     "meta": {"sources": {...}}}
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from specmoe.errors import UserError

__all__ = ["FORMAT", "read_token_table", "read_cost_model", "acceptance_from_run", "fit_vllm_steps",
           "build_policy", "add_parser", "run"]

FORMAT = "specmoe_vllm.policy/1"
_COST_FORMAT = "specmoe.cost_model/1"


def read_token_table(path: str | Path) -> dict[str, Any]:
    d = Path(path)
    meta_p, st_p = d / "token_table.json", d / "token_table.safetensors"
    for p in (meta_p, st_p):
        if not p.is_file():
            raise UserError(f"--token-table {d}: {p.name} is missing (a build_token_table stage directory has "
                            f"token_table.json and token_table.safetensors)")
    try:
        meta = json.loads(meta_p.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"--token-table {meta_p} is not JSON: {exc}") from None
    for key in ("num_layers", "num_experts", "top_k"):
        if not isinstance(meta.get(key), int):
            raise UserError(f"--token-table {meta_p}: '{key}' is missing or not an integer")
    from safetensors import safe_open

    with safe_open(str(st_p), framework="pt") as f:
        names = set(f.keys())
        for key in ("token_ids", "experts", "fallback"):
            if key not in names:
                raise UserError(f"--token-table {st_p}: tensor '{key}' is missing (has {', '.join(sorted(names))})")
        ids = f.get_tensor("token_ids").tolist()
        experts = f.get_tensor("experts").tolist()
        fallback = f.get_tensor("fallback").tolist()
        counts = f.get_tensor("token_counts").tolist() if "token_counts" in names else [1] * len(ids)
    shape = (meta["num_layers"], meta["top_k"])
    if (len(fallback), len(fallback[0]) if fallback else 0) != shape or any(
            (len(r), len(r[0]) if r else 0) != shape for r in experts):
        raise UserError(f"--token-table {st_p}: 'experts' / 'fallback' rows must be [num_layers={shape[0]}, "
                        f"top_k={shape[1]}] as token_table.json says")
    out = {"num_layers": meta["num_layers"], "num_experts": meta["num_experts"], "top_k": meta["top_k"],
           "fallback": fallback, "token_ids": [int(t) for t in ids], "table": experts,
           "token_counts": [int(c) for c in counts]}
    acc = meta.get("test_acc")  # the stage's held-out top-K accuracy: how far the policy trusts the listed experts
    if isinstance(acc, (int, float)) and not isinstance(acc, bool) and 0.0 <= acc <= 1.0:
        out["accuracy"] = float(acc)
    return out


def read_cost_model(path: str | Path) -> dict[str, float]:
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except FileNotFoundError:
        raise UserError(f"--cost-model {p} does not exist (a calibrate_cost stage writes cost_model.json; or run "
                        f"platform bench expert_latency --target DIR --calibrate)") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"--cost-model {p} is not JSON: {exc}") from None
    if d.get("format") != _COST_FORMAT or not isinstance(d.get("coef"), dict):
        raise UserError(f"--cost-model {p}: 'format' must be {_COST_FORMAT!r} with a 'coef' object "
                        f"(got format {d.get('format')!r})")
    coef = {k: float(v) for k, v in d["coef"].items()}
    out = {"fixed": coef.get("fixed", 0.0), "tokens": coef.get("tokens", 0.0) + coef.get("padded_tokens", 0.0),
           "expert_layers": coef.get("expert_layers", 0.0), "kv_slots": coef.get("kv_slots", 0.0)}
    out["kv_slots"] += coef.get("token_kv", 0.0)  # per verified token x slot: read as one token per row
    draft = (d.get("overheads") or {}).get("draft") or {}
    if "1" in draft:
        out["draft_steps"] = float(draft["1"]) / 3.0  # specmoe's draft phase of a 3-step chain, per step
    return out


def _fixed_runs(run_out: dict[str, Any]) -> list[dict[str, Any]]:
    """The runner output's fixed-draft-count runs (no speculation, chains): not the plugin's variants (plugin*)."""
    return [r for r in run_out.get("runs", []) if not r.get("name", "").startswith("plugin")]


def acceptance_from_run(run_out: dict[str, Any], sampled: bool = False) -> list[float] | None:
    """Conditional per-position acceptance of the longest fixed chain in a vllm_runner output, pooled over its
    cells of one kind: greedy (T = 0) or ``sampled`` (T > 0; a sampled draft is accepted far less often than a
    greedy one: on the demo's draft 0.05-0.17 at position 1 against 0.85). None where the run has no such cell."""
    spec = [r for r in _fixed_runs(run_out) if r.get("num_speculative_tokens", 0) > 0 and r.get("drafts")]
    if not spec:
        return None
    r = max(spec, key=lambda x: x["num_speculative_tokens"])
    cells = [c for c in r.get("cells") or [r] if (float(c.get("temperature", 0.0)) > 0) == sampled
             and c.get("drafts")]
    if not cells:
        return None
    drafts = sum(int(c["drafts"]) for c in cells)
    # accepted_per_pos (counts) where the runner wrote them, else the rates times the drafts
    counts = [sum(c["accepted_per_pos"][i] if c.get("accepted_per_pos") else c["acceptance_per_pos"][i] * c["drafts"]
                  for c in cells) for i in range(int(r["num_speculative_tokens"]))]
    cond, prev = [], float(drafts)
    for a in counts:
        cond.append(min(1.0, a / prev) if prev > 0 else 0.0)
        prev = float(a)
    return [round(c, 6) for c in cond]


def _expected_union(table: dict[str, Any], tokens: int) -> float:
    """Expected expert-layers of ``tokens`` tokens drawn by the table's frequencies (independent draws)."""
    L, E = table["num_layers"], table["num_experts"]
    total = float(sum(table["token_counts"])) or 1.0
    freq = [[0.0] * E for _ in range(L)]
    for row, c in zip(table["table"], table["token_counts"]):
        for layer, experts in enumerate(row):
            for e in experts:
                freq[layer][e] += c / total
    return sum(E - sum((1 - min(q, 1.0)) ** tokens for q in f) for f in freq)


def _step_samples(run_out: dict[str, Any]) -> list[tuple[int, int, float, bool]]:
    """(rows, drafts, seconds per step, sampled) of every cell of the runner's fixed-draft-count runs (seconds per
    step = seconds / (tokens / tokens per step / batch), by the runner's CPU seconds where present; sampled: the
    cell's temperature > 0)."""
    out = []
    for r in _fixed_runs(run_out):
        n = int(r.get("num_speculative_tokens", 0))
        for c in r.get("cells") or [r]:
            rows = int(c.get("batch", 1))
            steps = c["tokens"] / float(c.get("tokens_per_step") or 1.0) / rows
            sec = sum(c.get("cpu_seconds") or c["seconds"])  # CPU time where the runner measured it
            if steps > 0 and sec > 0:
                out.append((rows, n, sec / steps, float(c.get("temperature", 0.0)) > 0))
    return out


def _nnls_relative(x: Any, y: Any) -> Any:
    """Non-negative least squares on relative error (each step weighted by 1 / its seconds)."""
    from scipy.optimize import nnls

    w = 1.0 / y
    return nnls(x * w[:, None], y * w)[0]


def fit_vllm_steps(run_out: dict[str, Any], prior: dict[str, float], table: dict[str, Any] | None
                   ) -> tuple[dict[str, float], dict[str, float] | None]:
    """The step cost of vLLM's own fixed-draft-count runs (every cell), in the plugin's terms: ``fixed``,
    ``rows`` (per request of the step), ``tokens`` (verified: rows x (1 + drafts)), ``draft_steps`` (the drafts
    proposed), ``spec_pass`` (the drafter's own pass and the rejection sampler: every configuration with
    speculation pays it, also a step that proposes nothing; fitted where runs both with and without speculation
    exist), ``sampled_tokens`` (the verified tokens of cells at T > 0; fitted where both kinds of cell exist) and,
    with a token table, ``expert_layers`` (the expected expert union of the verified tokens, from the table's
    frequencies). Non-negative least squares on relative error; a term the runs cannot tell apart
    from another is left at 0: ``rows`` at one batch size, and there ``tokens`` too, since rows x (1 + drafts) is
    collinear with the drafts: a verified draft is then priced as part of its draft pass (``draft_steps``), so the
    policy's choice of how many *held* drafts to verify sees no saving in cutting a draft whose pass was paid (with
    ``tokens`` absorbing the draft passes instead, a batch-1 calibration of vLLM on a Zen 4 gave 0.99 ms per
    verified token and none per draft pass, and the plugin cut held chains in 16 % of its steps, where the
    chain of 5 verifies every draft and was faster). So is ``expert_layers`` at one batch size: the expected union
    of 1 + n tokens is a function of n alone there, and took the draft passes' cost the same way (0.19 ms per
    expert-layer, none per draft pass: the plugin cut held chains in 25 % of its steps); the expert term then needs
    runs at two batch sizes (or specmoe's own calibration, ``--cost-model``). ``prior``'s other terms
    (``kv_slots``) are kept.

    Returns ``(cost, cost_tokens)``: ``cost_tokens`` is the same fit without the expert term, the token-only
    variant's cost (None without a table, where ``cost`` is already token-only). A step's cost is concave in its
    token count on a CPU (vLLM's demo target, a Sapphire Rapids: 8 rows x 6 tokens ~42 ms, 8 x 1 ~12 ms,
    1 x 6 ~19 ms); one coefficient per verified token fitted across batch sizes without ``rows`` and the union
    over-priced drafts at batch 4 and 8 by 2-3x."""
    import numpy as np

    samples = _step_samples(run_out)
    if len({n for _, n, _, _ in samples}) < 2:
        raise UserError("--vllm-run: need runs with at least two draft counts (configs 0..n) to fit the step cost")
    names = ["fixed", "rows", "tokens", "draft_steps", "spec_pass", "expert_layers", "sampled_tokens"]
    union = {v: _expected_union(table, v) for v in {b * (1 + n) for b, n, _, _ in samples}} if table else {}
    x = np.array([[1.0, b, b * (1 + n), n, 1.0 if n > 0 else 0.0, union.get(b * (1 + n), 0.0),
                   b * (1 + n) if smp else 0.0] for b, n, _, smp in samples])
    y = np.array([sec for _, _, sec, _ in samples])
    # one batch size: rows is constant and tokens = rows x (1 + drafts): priced through fixed and the draft passes
    keep = [0, 1, 2, 3] if len(set(x[:, 1])) > 1 else [0, 3]
    if 0 < x[:, 4].sum() < len(x):
        keep.append(4)  # spec_pass: runs with and without speculation
    if 0 < (x[:, 6] > 0).sum() < len(x):
        keep.append(6)  # sampled_tokens: cells at T = 0 and T > 0

    def fit(cols: list[int]) -> dict[str, float]:
        coef = _nnls_relative(x[:, cols], y)
        out = {k: v for k, v in prior.items() if k not in names}
        out.update({k: 0.0 for k in names})
        out.update({names[c]: float(v) for c, v in zip(cols, coef)})
        return out

    if table and len(set(x[:, 1])) > 1:
        return fit(keep + [5]), fit(keep)
    return fit(keep), None


def build_policy(*, token_table: str | None, cost_model: str | None, vllm_run: str | None,
                 acceptance: list[float] | None, max_drafts: int = 5, tolerance: float = 0.01) -> dict[str, Any]:
    table = read_token_table(token_table) if token_table else None
    cost = read_cost_model(cost_model) if cost_model else {}
    cost_tokens = None
    run_out = sampled = None
    if vllm_run:
        try:
            run_out = json.loads(Path(vllm_run).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"--vllm-run {vllm_run}: cannot read it as JSON ({exc})") from None
        cost, cost_tokens = fit_vllm_steps(run_out, cost, table)
        if acceptance is None:
            acceptance = acceptance_from_run(run_out)
        sampled = acceptance_from_run(run_out, sampled=True)
    if not cost:
        raise UserError("export-policy needs a cost: --cost-model (specmoe's calibration) and/or --vllm-run (the "
                        "vLLM runner's output of fixed draft counts)")
    if table is None and cost.get("expert_layers", 0) > 0:
        raise UserError("--cost-model prices experts (expert_layers > 0): give --token-table too")
    cost.setdefault("draft_steps", 0.0)
    if cost.get("fixed", 0) + cost.get("tokens", 0) <= 0:
        raise UserError("the step cost has neither a fixed nor a per-token term: check --cost-model / --vllm-run")
    prior = acceptance or [0.8]
    if not all(0 <= a <= 1 and not math.isnan(a) for a in prior):
        raise UserError(f"--acceptance: rates must lie in [0, 1], got {prior}")
    policy = {"format": FORMAT, "max_drafts": int(max_drafts), "tolerance": float(tolerance),
              "cost": {k: float(v) for k, v in cost.items()},
              # request_strength: a request's own factor is shrunk towards the pool by 32 expected accepted
              # drafts; with 8, two rejected first drafts put a request on the floor, and on the demo's draft
              # (vLLM, Zen 4, batch 1, T = 0, where a chain of 5 beat no speculation on each of 16 prompts,
              # 1.04-1.48x) 57-149 of ~430 steps went plain
              "acceptance": {"prior": {"greedy": prior, "sampled": sampled or [a * 0.9 for a in prior]},
                             "strength": 20, "request_strength": 32},
              "meta": {"sources": {"table_dir": token_table, "cost_model": cost_model, "vllm_run": vllm_run}}}
    if cost_tokens is not None:
        policy["cost_tokens"] = {k: float(v) for k, v in cost_tokens.items()}
    if table is not None:
        policy["experts"] = table
    return policy


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("peer", help="the vLLM plugin's files: platform peer export-policy ...")
    inner = p.add_subparsers(dest="action", metavar="ACTION")
    ex = inner.add_parser("export-policy", help="write the specmoe_vllm policy file (cost, experts, acceptance)",
                          description=__doc__.split("\n\n")[1] if __doc__ else None)
    ex.add_argument("--token-table", default=None, help="build_token_table stage directory")
    ex.add_argument("--cost-model", default=None, help="cost_model.json of calibrate_cost (specmoe format)")
    ex.add_argument("--vllm-run", default=None, help="vllm_runner.py output with configs 0..n (refits the cost)")
    ex.add_argument("--acceptance", default=None, help="comma-separated conditional acceptance per position")
    ex.add_argument("--max-drafts", type=int, default=5)
    ex.add_argument("--tolerance", type=float, default=0.01, help="speculation must beat plain decoding by this")
    ex.add_argument("--out", required=True, help="policy JSON file to write")
    ex.set_defaults(func=run)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def run(args: argparse.Namespace) -> int:
    acc = None
    if args.acceptance:
        try:
            acc = [float(a) for a in args.acceptance.split(",")]
        except ValueError:
            raise UserError(f"--acceptance '{args.acceptance}': give numbers like 0.9,0.85,0.6") from None
    pol = build_policy(token_table=args.token_table, cost_model=args.cost_model, vllm_run=args.vllm_run,
                       acceptance=acc, max_drafts=args.max_drafts, tolerance=args.tolerance)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(pol))
    c = pol["cost"]
    print(f"wrote {out}: cost ms fixed {c['fixed'] * 1e3:.3f}, per request {c.get('rows', 0) * 1e3:.3f}, per token "
          f"{c['tokens'] * 1e3:.4f}, per expert-layer "
          f"{c.get('expert_layers', 0) * 1e3:.4f}, per draft step {c['draft_steps'] * 1e3:.3f}, speculative "
          f"machinery per step {c.get('spec_pass', 0) * 1e3:.3f}; acceptance prior "
          f"{pol['acceptance']['prior']['greedy']}; experts: {'yes' if 'experts' in pol else 'no'}")
    return 0
