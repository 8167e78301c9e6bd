# SPDX-License-Identifier: Apache-2.0
"""``platform compare`` with both engines: after the recipe's cell tables, one table per ``platform bench peer`` run
(specmoe's and vLLM's rows per batch x temperature cell, an ``engine`` column telling them apart).

A bench peer run is a FINISHED run tagged :data:`BENCH_TAG` with its rows in :data:`ARTIFACT` (row name
``<engine>/<method>[/b<batch>_T<temperature>]`` -> values); default the latest, ``--run-id`` / ``--all-runs``
pick. ``--format csv``: the cell records, a blank line, then the engine records (each with its header)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from specmoe.errors import UserError
from specmoe.evaluation import report_tables as rt

if TYPE_CHECKING:
    from mlflow.entities import Run

__all__ = ["BENCH_TAG", "ARTIFACT", "bench_runs", "engine_table", "compare"]

#: the tag (key, value) of a run whose artifact :data:`ARTIFACT` holds engine rows (``platform bench peer`` sets it)
BENCH_TAG = ("specmoe.rows", "engines")
#: the artifact holding the rows
ARTIFACT = "bench_peer.json"
_COLUMNS = ["engine", "method", "batch", "T", "γ", "tok/s", "tok/s CPU", "tok/step", "agree", "vs best fixed",
            "budget viol."]


def bench_runs(uri: str, experiment: str, run_id: str | None = None, all_runs: bool = False) -> list[Run]:
    """``experiment``'s FINISHED bench peer runs, newest first: all, the one ``run_id``, or the latest (or none)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    flt = f"tags.`{BENCH_TAG[0]}` = '{BENCH_TAG[1]}' and attributes.status = 'FINISHED'"
    runs = list(client.search_runs([exp.experiment_id], filter_string=flt, max_results=1000,
                                   order_by=["attributes.start_time DESC"]))
    if run_id:
        return [r for r in runs if r.info.run_id == run_id]
    return runs if all_runs else runs[:1]


def _split(name: str) -> tuple[str, str, int, float]:
    """``vllm/plugin/b4_T1`` -> engine, method, batch, temperature (``specmoe/ar`` -> batch 1, T 0)."""
    engine, _, rest = name.partition("/")
    method, batch, temp = rest, 1, 0.0
    head, _, last = rest.rpartition("/")
    if head and last.startswith("b") and "_T" in last:
        b, t = last[1:].split("_T", 1)
        try:
            method, batch, temp = head, int(b), float(t)
        except ValueError:
            pass
    return engine, method, batch, temp


def _fmt(v: Any, spec: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


def engine_table(run: Run, rows: dict[str, dict[str, Any]]) -> rt.Table:
    """One bench peer run's table: a row per engine, method and cell (columns: ``_COLUMNS``)."""
    p = run.data.params
    title = (f"bench peer {run.info.run_name or ''} ({run.info.run_id[:8]}): both engines on the same prompts — "
             f"{p.get('dtype', '?')}, {p.get('prompts', '?')} prompts x {p.get('new_tokens', '?')} new tokens, "
             f"vLLM {p.get('vllm_version', '-')}, cpu {p.get('cpu', '?')}")
    out, records = [], []
    for name, m in sorted(rows.items(), key=lambda kv: (_split(kv[0])[3], _split(kv[0])[2], kv[0])):
        engine, method, batch, temp = _split(name)
        viol = (m.get("plugin") or {}).get("budget_violations")
        rec = {"table": "engines", "run_id": run.info.run_id, "engine": engine, "method": method, "batch": batch,
               "temperature": temp, "budget_violations": viol,
               **{k: m.get(k) for k in ("gamma", "tok_s", "tok_s_cpu", "tokens_per_step", "agreement",
                                        "vs_best_fixed")}}
        records.append(rec)
        out.append([engine, method, str(batch), f"{temp:g}", _fmt(rec["gamma"], "d"), _fmt(rec["tok_s"], ".1f"),
                    _fmt(rec["tok_s_cpu"], ".1f"), _fmt(rec["tokens_per_step"], ".3f"),
                    _fmt(rec["agreement"], ".2f"), _fmt(rec["vs_best_fixed"], ".3f", "x"), _fmt(viol, "d")])
    notes = ["agree: share of prompts whose greedy output equals vLLM's without speculation (T > 0: -); vs best "
             "fixed: the plugin's tok/s over the cell's best of no speculation and each fixed draft count"]
    return rt.Table(title, list(_COLUMNS), out, records, notes)


def compare(uri: str, experiment: str, metrics: Sequence[str] = rt.DEFAULT_METRICS, run_id: str | None = None,
            all_runs: bool = False, fmt: str = "text", verdict: Sequence[str] = (),
            margin: float = rt.DEFAULT_MARGIN) -> str:
    """:func:`specmoe.evaluation.report_tables.compare` (the cell tables), then the engine table of each bench
    peer run of the experiment; an experiment with only bench peer runs shows those alone."""
    from specmoe.tracking.runs import json_artifacts

    runs = bench_runs(uri, experiment, run_id, all_runs)
    if not runs:
        return rt.compare(uri, experiment, metrics, run_id, all_runs, fmt, verdict, margin)
    tables = []
    with json_artifacts(uri) as read:
        for run in runs:
            rows = read(run.info.run_id, ARTIFACT)
            if not isinstance(rows, dict):
                raise UserError(f"bench peer run {run.info.run_id} in {experiment!r} at {uri} has no {ARTIFACT} "
                                f"artifact (a run of an older platform bench peer, or one still logging)")
            tables.append(engine_table(run, rows))
    try:
        cells = rt.compare(uri, experiment, metrics, run_id, all_runs, fmt, verdict, margin)
    except UserError:
        if verdict:
            raise
        cells = ""  # no recipe cells here (or run_id names the bench run): the engine tables alone
    engines = rt.render(tables, fmt)
    return cells + "\n" + engines if cells else engines  # csv: two blocks, each with its header
