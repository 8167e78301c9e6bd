# SPDX-License-Identifier: Apache-2.0
"""How many draft tokens each request verifies this step: specmoe's goodput rule, pure Python.

Nothing here imports vLLM (or specmoe): the module runs in vLLM's environment and in specmoe's tests alike.

The rule, per step and for the batch jointly. Each decode request ``r`` holds ``m_r`` proposed draft tokens
(``m_r <= K``, vLLM's ``num_speculative_tokens``); the policy picks ``k_r in 0..m_r`` maximising the step's
expected tokens per second::

    rate(k) = sum_r (1 + E_r(k_r)) / T_step(k)
    E_r(k)  = sum_{i=1..k} prod_{j<=i} a_{r,j}         expected accepted drafts of a chain of k
    T_step  = c_fixed + c_rows * rows + c_tokens * tokens + c_expert * sum_l |U_l| + c_kv * kv_slots
              + c_draft * K_next + c_spec * [the step speculates: it verifies a draft or K_next > 0]
              + c_sampled * (tokens of sampled requests)

``a_{r,j}`` is the conditional acceptance of draft position ``j`` (P(accepted | position j-1 accepted)), counted
online from what vLLM reports as accepted per request (a Beta prior per position from the policy file), scaled
per request by how that request's realised acceptance compares with the pooled one (shrunk towards 1), separately
for greedy and sampled requests. ``U_l`` is the predicted expert union of the pass at MoE layer ``l``: every
verified token's experts from the token-to-experts table (the roots and the drafts; a token missing from the
table takes the table's fallback row), as an expectation under the table's accuracy ``a`` (``experts.accuracy``
in the file: a token routed to its listed experts with probability ``a``, else as a random token;
:class:`_Union`). The expert term off (``expert_cost = False``) is the token-only variant
(what vLLM's own adaptive budgets price).

The choice is a greedy path: from all-zero (plain decoding, the AR floor) it adds, one at a time, the next draft
of the request whose addition gives the highest rate, up to every draft, and keeps the prefix of that path with
the highest rate (where no subset of the drafts can beat the rate of all of them by the tolerance, a bound from
each draft's chain probability and its share of the expert-layers it adds, the path is not walked: that is its
result, :meth:`GoodputPolicy._all_or_nothing`); speculation is kept only where it beats the all-zero rate by
the tolerance. The same tolerance is a guard band between speculative choices: a shorter choice than every
proposed draft (what a fixed configuration verifies) must beat it by the tolerance too (gains under it are within
the models' error; switching for them cost more than it won). ``K_next`` is the best fixed length for the shared
rates whenever speculating beats the floor for the batch's requests (:meth:`GoodputPolicy._plan`), with the same
guard band: the longest length within the tolerance of the best.

On the floor nothing is drafted, so nothing is learned: one unlucky step (a rejected first draft lowers that
request's factor) could keep a request on the floor for good. So after ``PROBE_FIRST`` consecutive floor steps
the policy *probes*: it proposes the best non-zero ``K_next`` and verifies all of the probe's drafts next step;
the wait doubles after each probe that does not bring speculation back (up to ``PROBE_MAX`` steps, so where
the floor is right a probe costs at most a step in ``PROBE_MAX``), and starts again at ``PROBE_FIRST`` once the
plan speculates on its own. ``K_next`` (how many
drafts vLLM's proposer makes for the next step, its ``num_spec_tokens_to_schedule``) is planned the same way with
the drafts not yet known: their experts are the table's frequency-weighted inclusion probabilities per expert
(an expected union). With ``K_next = 0`` the drafter only absorbs the step's tokens (no draft forward passes).

``c_spec`` is what vLLM's speculative machinery costs a step besides the drafts (the drafter's pass over the step's
tokens, the rejection sampler). With ``plain_steps`` (the plugin's ``skip_drafter``, :mod:`specmoe_vllm.drafter`)
a step that verifies nothing and proposes nothing does not pay it (it runs as plain decoding); without, every step
does (vLLM's own behaviour), so the floor is plain decoding plus ``c_spec``.

The cost coefficients start from the policy file (specmoe's calibration, converted by ``platform peer
export-policy``) and are refitted online from the measured step times (relative-error ridge regression towards
the file's coefficients, non-negative), so the cost is vLLM's own on the machine. ``c_rows`` (per request in the
step: its sampler row, its bookkeeping) and the expert term make a step's cost concave in its token count, as it
is (a CPU step of 8 rows x 6 tokens cost ~2x one of 8 rows x 1 token, not 6x). The token-only variant prices
with the file's ``cost_tokens`` where it has one: coefficients fitted without the expert term (the best a
token-count cost can do), else with ``cost`` less its expert term.
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = ["FORMAT", "COST_TERMS", "PROBE_FIRST", "PROBE_MAX", "REF_STEPS",
           "PolicyFileError", "PolicySpec", "ExpertTable", "CostTerms", "Acceptance",
           "Row", "Decision", "GoodputPolicy", "load_policy"]

#: the policy file's ``format`` value this module reads
FORMAT = "specmoe_vllm.policy/1"
#: the step-cost terms (seconds per unit); see the module docstring
COST_TERMS = ("fixed", "rows", "tokens", "expert_layers", "kv_slots", "draft_steps", "spec_pass", "sampled_tokens")
_KV = COST_TERMS.index("kv_slots")
#: consecutive floor steps before the first probe, and the most the doubling wait between probes grows to
PROBE_FIRST, PROBE_MAX = 8, 256
#: steps a batch kind's best fixed proposal length is kept before it is planned again
REF_STEPS = 32


class PolicyFileError(ValueError):
    """A policy file that cannot be used: the message names the file, the key and the fix."""


def _bad(path: str, key: str, why: str) -> PolicyFileError:
    return PolicyFileError(f"specmoe_vllm policy file {path}: '{key}' {why} (write it with: platform peer "
                           f"export-policy --cost-model COST.json --token-table TABLE_DIR --out {path})")


# ------------------------------------------------------------------------------------------------ the file
@dataclass
class ExpertTable:
    """Token id -> experts per MoE layer (``top_k`` each), a fallback row, and per-layer expert frequencies."""

    num_layers: int
    num_experts: int
    top_k: int
    experts: dict[int, list[list[int]]]
    fallback: list[list[int]]
    #: per layer and expert: P(expert among a random token's top_k) (sums to top_k per layer)
    frequency: list[list[float]]
    #: P(a listed expert is among the token's routed ones) (the table's held-out top-K accuracy; 1: taken as
    #: certain)
    accuracy: float = 1.0
    #: token -> its flat slots ``layer * num_experts + expert`` as the bits of an int (key -1: the fallback row)
    masks: dict[int, int] = field(default_factory=dict)
    _unknown: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        def mask(rows: list[list[int]]) -> int:
            m = 0
            for layer, r in enumerate(rows):
                for e in r:
                    m |= 1 << (layer * self.num_experts + e)
            return m

        self.masks = {t: mask(r) for t, r in self.experts.items()}
        self.masks[-1] = mask(self.fallback)

    def of(self, token: int) -> list[list[int]]:
        return self.experts.get(int(token), self.fallback)

    def unknown_union(self, n: int) -> float:
        """Expected expert-layers touched by ``n`` draft tokens not known yet (each expert independently, with
        its frequency): sum over layers and experts of 1 - (1 - q)^n; memoised by n."""
        while len(self._unknown) <= n:
            m = len(self._unknown)
            self._unknown.append(sum(1.0 - (1.0 - min(q, 1.0)) ** m for f in self.frequency for q in f))
        return self._unknown[n]


@dataclass
class CostTerms:
    """Seconds per unit of each :data:`COST_TERMS` entry (``coef`` is read once, when made: a refit makes a new
    one)."""

    coef: dict[str, float]

    def __post_init__(self) -> None:
        self._c = tuple(self.coef.get(k, 0.0) for k in COST_TERMS)

    def seconds(self, x: dict[str, float], expert_cost: bool = True) -> float:
        """A step of shape ``x`` (units per term, :func:`_shape`)."""
        return self._dot([x.get(k, 0.0) for k in COST_TERMS], expert_cost)

    def price(self, rows: float, tokens: float, union: float, kv: float, k_next: float, spec: float,
              sampled: float, expert_cost: bool) -> float:
        """:meth:`seconds` of the shape :func:`_shape` would make of these units, without making it (the
        decision prices a step several times)."""
        return self._dot((1.0, rows, tokens, union, kv, k_next, spec, sampled), expert_cost)

    def _dot(self, u: Sequence[float], expert_cost: bool) -> float:
        """Units in :data:`COST_TERMS` order -> seconds (the expert term last, and only with ``expert_cost``)."""
        f, c_rows, c_tok, c_exp, c_kv, c_draft, c_spec, c_smp = self._c
        s = f * u[0] + c_rows * u[1] + c_tok * u[2] + c_kv * u[4] + c_draft * u[5] + c_spec * u[6] + c_smp * u[7]
        return s + c_exp * u[3] if expert_cost else s


@dataclass
class PolicySpec:
    """The policy file, validated (schema in the package README)."""

    path: str
    max_drafts: int
    cost: CostTerms
    table: ExpertTable | None
    prior: dict[str, list[float]]
    prior_strength: float
    request_strength: float
    tolerance: float
    meta: dict[str, Any] = field(default_factory=dict)
    #: the token-only variant's coefficients (``cost_tokens`` in the file; None: ``cost`` less its expert term)
    cost_tokens: CostTerms | None = None


def _num(d: dict, key: str, path: str, lo: float = 0.0, hi: float = math.inf, default: Any = None) -> float:
    if key not in d:
        if default is None:
            raise _bad(path, key, "is missing")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi or v != v:
        raise _bad(path, key, f"must be a number in [{lo}, {hi}], got {v!r}")
    return float(v)


def _table(d: Any, path: str) -> ExpertTable:
    if not isinstance(d, dict):
        raise _bad(path, "experts", "must be an object")
    layers = int(_num(d, "num_layers", path, 1))
    n_exp = int(_num(d, "num_experts", path, 1))
    top_k = int(_num(d, "top_k", path, 1, n_exp))

    def rows(v: Any, key: str) -> list[list[int]]:
        ok = (isinstance(v, list) and len(v) == layers and all(
            isinstance(r, list) and len(r) == top_k and all(isinstance(e, int) and 0 <= e < n_exp for e in r)
            for r in v))
        if not ok:
            raise _bad(path, key, f"must be {layers} lists of {top_k} expert ids in [0, {n_exp})")
        return v

    fallback = rows(d.get("fallback"), "experts.fallback")
    ids, table = d.get("token_ids"), d.get("table")
    if not isinstance(ids, list) or not isinstance(table, list) or len(ids) != len(table):
        raise _bad(path, "experts.token_ids", "and 'experts.table' must be lists of the same length")
    experts = {int(t): rows(r, f"experts.table[{i}]") for i, (t, r) in enumerate(zip(ids, table))}
    counts = d.get("token_counts") or [1] * len(ids)
    if not isinstance(counts, list) or len(counts) != len(ids):
        raise _bad(path, "experts.token_counts", "must list one count per token id")
    freq = [[0.0] * n_exp for _ in range(layers)]
    total = float(sum(counts)) or 1.0
    for t, c in zip(ids, counts):
        for layer, row in enumerate(experts[int(t)]):
            for e in row:
                freq[layer][e] += c / total
    if not ids:
        for layer, row in enumerate(fallback):
            for e in row:
                freq[layer][e] = 1.0
    return ExpertTable(layers, n_exp, top_k, experts, fallback, freq,
                       _num(d, "accuracy", path, 0.0, 1.0, default=1.0))


def _cost(cost: Any, key: str, p: str) -> dict[str, float]:
    """A cost object of the file (``cost`` / ``cost_tokens``): seconds per unit of each known term."""
    if not isinstance(cost, dict):
        raise _bad(p, key, "must be an object of seconds per unit")
    unknown = sorted(set(cost) - set(COST_TERMS))
    if unknown:
        raise _bad(p, f"{key}.{unknown[0]}", f"is not a cost term (known: {', '.join(COST_TERMS)})")
    coef = {k: _num(cost, k, p, 0.0, 10.0, default=0.0) for k in COST_TERMS}
    if coef["fixed"] + coef["tokens"] <= 0:
        raise _bad(p, f"{key}.fixed", f"and '{key}.tokens' cannot both be 0 (a pass costs time)")
    return coef


def load_policy(path: str | Path) -> PolicySpec:
    """Read and check a policy file; every problem raises :class:`PolicyFileError` naming the file and key."""
    p = str(path)
    try:
        with open(p) as f:
            d = json.load(f)
    except FileNotFoundError:
        raise PolicyFileError(f"specmoe_vllm policy file {p} does not exist (write it with: platform peer "
                              f"export-policy --cost-model COST.json --token-table TABLE_DIR --out {p})") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise PolicyFileError(f"specmoe_vllm policy file {p} is not readable JSON: {exc}") from None
    if not isinstance(d, dict):
        raise _bad(p, "(top level)", "must be a JSON object")
    if d.get("format") != FORMAT:
        raise _bad(p, "format", f"is {d.get('format')!r}, this plugin reads {FORMAT!r}")
    coef = _cost(d.get("cost"), "cost", p)
    coef_tokens = _cost(d["cost_tokens"], "cost_tokens", p) if d.get("cost_tokens") is not None else None
    acc = d.get("acceptance")
    if not isinstance(acc, dict):
        raise _bad(p, "acceptance", "must be an object with 'prior' (greedy / sampled per-position rates)")
    prior_d = acc.get("prior")
    if not isinstance(prior_d, dict) or "greedy" not in prior_d:
        raise _bad(p, "acceptance.prior", "must be an object with a 'greedy' list (and optionally 'sampled')")
    prior = {}
    for kind in ("greedy", "sampled"):
        v = prior_d.get(kind, prior_d["greedy"])
        if not isinstance(v, list) or not v or not all(
                isinstance(a, (int, float)) and not isinstance(a, bool) and 0 <= a <= 1 for a in v):
            raise _bad(p, f"acceptance.prior.{kind}", "must be a non-empty list of probabilities in [0, 1]")
        prior[kind] = [float(a) for a in v]
    table = _table(d["experts"], p) if d.get("experts") is not None else None
    if coef["expert_layers"] > 0 and table is None:
        raise _bad(p, "experts", "is missing: 'cost.expert_layers' > 0 needs the token-to-experts table")
    if coef_tokens is not None and coef_tokens["expert_layers"] > 0:
        raise _bad(p, "cost_tokens.expert_layers", "must be 0 (cost_tokens is the token-only variant's cost)")
    return PolicySpec(path=p, max_drafts=int(_num(d, "max_drafts", p, 1, 64, default=8)), cost=CostTerms(coef),
                      cost_tokens=CostTerms(coef_tokens) if coef_tokens is not None else None,
                      table=table, prior=prior, prior_strength=_num(acc, "strength", p, 0.0, 1e6, default=20.0),
                      request_strength=_num(acc, "request_strength", p, 0.0, 1e6, default=8.0),
                      tolerance=_num(d, "tolerance", p, 0.0, 1.0, default=0.01), meta=d.get("meta") or {})


# ------------------------------------------------------------------------------------------ acceptance
class Acceptance:
    """Per-position conditional acceptance, counted online, per kind (``greedy`` / ``sampled``), and a per-request
    factor (its accepted drafts over what the pooled rates expected for its trials, shrunk towards 1)."""

    def __init__(self, prior: dict[str, list[float]], strength: float, request_strength: float, positions: int):
        self.positions = positions
        self.strength = strength
        self.request_strength = request_strength
        self.hits: dict[str, list[float]] = {}
        self.trials: dict[str, list[float]] = {}
        for kind, rates in prior.items():
            r = [rates[min(i, len(rates) - 1)] for i in range(positions)]
            self.hits[kind] = [a * strength for a in r]
            self.trials[kind] = [strength] * positions
        self._req: dict[str, list[float]] = {}  # request -> [accepted, expected]
        self._rates: dict[str, list[float]] = {}  # kind -> its rates, until the next observation of that kind

    def rates(self, kind: str) -> list[float]:
        """Every position's :meth:`rate` (kept until the kind's next observation: a step reads them once per
        request and per plan, ~10 us a step at batch 8 when divided again each time)."""
        r = self._rates.get(kind)
        if r is None:
            r = self._rates[kind] = [h / t if t > 0 else 0.0 for h, t in zip(self.hits[kind], self.trials[kind])]
        return r

    def rate(self, kind: str, pos: int) -> float:
        """P(draft at 0-based position ``pos`` accepted | the one before it accepted)."""
        return self.rates(kind)[pos]

    def factor(self, req: str) -> float:
        acc, exp = self._req.get(req, (0.0, 0.0))
        m = self.request_strength
        return (acc + m) / (exp + m) if exp + m > 0 else 1.0

    def chain(self, kind: str, req: str, k: int, pooled: bool = False) -> list[float]:
        """P(drafts 1..i all accepted) for i = 1..k (the request's factor applied per position, capped at 1;
        ``pooled``: without it, the rates every request shares)."""
        f = 1.0 if pooled else self.factor(req)
        out, p = [], 1.0
        for a in self.rates(kind)[:k]:
            a *= f
            p *= a if a < 1.0 else 1.0
            out.append(p)
        return out

    def observe(self, kind: str, req: str, drafted: int, accepted: int) -> None:
        """One verified step of ``req``: ``drafted`` drafts scheduled, the first ``accepted`` of them accepted."""
        if drafted <= 0:
            return
        accepted = max(0, min(accepted, drafted))
        seen = min(accepted + 1, drafted)  # positions whose outcome the step shows
        expected = sum(self.rates(kind)[:seen])
        hits, trials = self.hits[kind], self.trials[kind]
        for i in range(seen):
            trials[i] += 1
        for i in range(accepted):
            hits[i] += 1
        self._rates.pop(kind, None)
        r = self._req.setdefault(req, [0.0, 0.0])
        r[0] += accepted
        r[1] += expected

    def forget(self, req: str) -> None:
        self._req.pop(req, None)


# ------------------------------------------------------------------------------------------ online cost
def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (small dense systems)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[piv] = m[piv], m[c]
        if abs(m[c][c]) < 1e-300:
            continue
        for r in range(n):
            if r != c and m[r][c] != 0:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] if abs(m[i][i]) > 1e-300 else 0.0 for i in range(n)]


class OnlineCost:
    """Step-time coefficients refitted from measured steps: minimise sum ((x.c - y) / y)^2 + w * sum ((c_j - p_j) /
    s_j)^2 over a sliding window (p: the file's coefficients, s_j: their scale, or for a zero prior the
    coefficient that alone explains 1/n of the mean step), terms clipped at 0 and refitted without them. The
    window's normal equations are kept as running sums (a step adds its row, the one leaving the window is taken
    out), so a refit solves one small system instead of reading the window again (that read cost ~1-2 % of a
    floor step in pure Python).

    Consecutive steps of one shape (every term equal but ``kv_slots``, which grows a token per step: floor steps
    of the same requests) enter as one row of weight m (up to ``batch``), their mean shape and time: the same
    normal equations up to the spread of kv_slots within the run, at a fraction of the host work per step (a
    step's accounting cost ~30 us inside vLLM, where the model's pass leaves the interpreter's caches cold). The
    window counts steps (weights), not rows."""

    def __init__(self, prior: CostTerms, window: int = 256, prior_weight: float = 4.0, every: int = 64,
                 batch: int = 8):
        self.prior = {k: prior.coef.get(k, 0.0) for k in COST_TERMS}  # a term the caller left out is 0
        self.current = CostTerms(dict(self.prior))
        self.window = window
        self.obs: deque[tuple[list[float], float, float]] = deque()  # (shape, seconds, weight)
        self.prior_weight = prior_weight
        self.every = every
        self.batch = max(1, int(batch))
        self._since = 0.0
        self._w = 0.0  # steps in the window
        self._run: list[Any] | None = None  # the open run of one shape: [shape, kv sum, seconds sum, steps]
        n = len(COST_TERMS)
        self._ata = [[0.0] * n for _ in range(n)]  # sum over the window of w (x / y)(x / y)^T (upper triangle)
        self._atb = [0.0] * n  # sum of w x / y
        self._sx = [0.0] * n  # sum of w x
        self._sy = 0.0  # sum of w y

    def _account(self, x: list[float], y: float, weight: float) -> None:
        nz = [(i, v / y, v) for i, v in enumerate(x) if v != 0.0]  # a floor step leaves some terms at 0
        atb, sx, ata = self._atb, self._sx, self._ata
        for n, (i, ri, xi) in enumerate(nz):
            atb[i] += weight * ri
            sx[i] += weight * xi
            a, wri = ata[i], weight * ri
            for j, rj, _ in nz[n:]:  # the upper triangle (i <= j): the matrix is symmetric
                a[j] += wri * rj
        self._sy += weight * y

    def observe(self, x: dict[str, float], seconds: float) -> None:
        if not seconds > 0:
            return
        row = [x.get(k, 0.0) for k in COST_TERMS]
        run = self._run
        if run is not None:
            if run[3] < self.batch and row[:_KV] == run[0][:_KV] and row[_KV + 1:] == run[0][_KV + 1:]:
                run[1] += row[_KV]
                run[2] += seconds
                run[3] += 1
                return
            self._close_run()
        self._run = [row, row[_KV], seconds, 1]

    def _close_run(self) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        shape, kv, y, m = run
        shape = list(shape)
        shape[_KV] = kv / m
        while self.obs and self._w + m > self.window:
            old = self.obs.popleft()
            self._account(old[0], old[1], -old[2])
            self._w -= old[2]
        self.obs.append((shape, y / m, float(m)))
        self._account(shape, y / m, float(m))
        self._w += m
        self._since += m
        if self._since >= self.every:
            self._refit()

    def refit(self) -> None:
        """Refit now (the open run of steps included)."""
        self._close_run()
        self._refit()

    def _refit(self) -> None:
        self._since = 0
        if not self.obs:
            return
        n, m = len(COST_TERMS), self._w
        # a term's ridge scale: its prior, or (a zero prior) the coefficient that alone would explain 1/n of
        # the mean step, so a term the file left at 0 can still be learned from the steps
        mean_y = self._sy / m
        scale = [max(self.prior[k], mean_y / (n * self._sx[j] / m) if self._sx[j] > 1e-12 else 1e-7)
                 for j, k in enumerate(COST_TERMS)]
        active = list(range(n))
        coef = [0.0] * n
        for _ in range(n):
            ata = [[self._ata[min(i, j)][max(i, j)] for j in active] for i in active]
            atb = [self._atb[i] for i in active]
            for i, j in enumerate(active):
                w = self.prior_weight / scale[j] ** 2
                ata[i][i] += w
                atb[i] += w * self.prior[COST_TERMS[j]]
            sol = _solve(ata, atb)
            neg = [j for j, v in zip(active, sol) if v < 0]
            coef = [0.0] * n
            for j, v in zip(active, sol):
                coef[j] = max(v, 0.0)
            if not neg:
                break
            active = [j for j in active if j not in neg]
        self.current = CostTerms(dict(zip(COST_TERMS, coef)))


def _shape(rows: int, tokens: float, union: float, kv: float, k_next: int, spec: float, sampled: float = 0.0
           ) -> dict[str, float]:
    """A step's units of every :data:`COST_TERMS` entry (``sampled``: the verified tokens of requests sampled at
    T > 0, whose verification samples: vLLM's T > 0 steps cost more per token, its rejection sampler's
    probabilities)."""
    return {"fixed": 1.0, "rows": float(rows), "tokens": tokens, "expert_layers": union, "kv_slots": kv,
            "draft_steps": float(k_next), "spec_pass": spec, "sampled_tokens": sampled}


# ------------------------------------------------------------------------------------------ the decision
@dataclass
class Row:
    """One request of the step. ``drafts``: its proposed draft tokens (may be empty); ``root``: its last token
    (verified in any case); ``context``: cached tokens; ``sampled``: temperature > 0; ``extra_tokens``: tokens the
    pass computes for it besides root and drafts (a prefill chunk: ``root`` is then ignored for experts)."""

    req: str
    drafts: Sequence[int]
    root: int | None = None
    context: int = 0
    sampled: bool = False
    extra_tokens: int = 0


@dataclass
class Decision:
    """``k[req]``: drafts to verify per request; ``k_next``: drafts to propose for the next step; the expected
    rates (tokens / s) of the choice and of plain decoding, and the shape the cost model priced."""

    k: dict[str, int]
    k_next: int
    rate: float
    ar_rate: float
    shape: dict[str, float]
    #: the step's predicted seconds where the decision priced it already (a floor step), else 0
    seconds: float = 0.0


class _Union:
    """The pass's expert union over all MoE layers (flat ``layer * E + expert`` slots, the bits of an int) and its
    size; unknown draft tokens are priced separately (:meth:`GoodputPolicy._plan`). A token's gain and its addition
    are a few integer operations (a step of 8 requests x 5 drafts asks ~300 gains: in a Python loop over each
    token's slots they cost ~0.3 ms of host work per step; as frozenset operations ~0.1 ms inside vLLM).

    The table lists each token's experts with accuracy ``a`` (:attr:`ExpertTable.accuracy`): a token is routed to
    its listed experts with probability ``a`` and otherwise as a random token (the experts' frequencies). The
    pass's expected union is then priced as ``a x |listed union| + (1 - a) x`` the expected union of as many random
    tokens (:meth:`size`), and a draft adds ``a x`` its new listed slots (:meth:`gain`) ``+`` :meth:`more`. With
    ``a = 1`` (a file without ``accuracy``) the listed union is taken as certain. Taken as certain at ``a = 0.73``
    (the demo's table), it overstated what a draft with rarely listed experts adds: vLLM on a Zen 4, batch 8,
    T = 0, 48 prompts, the same policy file in one process, the plugin verified fewer than the five proposed
    drafts in 51 of 1,013 request-steps (4.613 tokens a step; the chain of 5: 4.675), priced at ``a`` in 15 of
    1,002 (4.657); over four earlier grids the expert-aware variant had run 1.4-5.4 % under the token-only one
    there."""

    def __init__(self, table: ExpertTable | None):
        self.table = table
        self.seen = 0
        self.n = 0  # listed expert-layers (the bits of seen; prefill tokens add their expected ones)
        self.count = 0  # tokens in the pass (prefill tokens up to 64)
        self.a = table.accuracy if table is not None else 1.0
        self._masks: dict[int, int] = table.masks if table else {}

    def size(self) -> float:
        """The expected expert-layers of the pass."""
        if self.a >= 1.0 or self.table is None:
            return float(self.n)
        return self.a * self.n + (1.0 - self.a) * self.table.unknown_union(self.count)

    def more(self, tokens: int = 1) -> float:
        """The random part of ``tokens`` more tokens' gain: ``(1 - a) x`` the growth of a random union from
        :attr:`count` tokens (the same for every draft: it depends on how many join the pass, not which)."""
        if self.a >= 1.0 or self.table is None:
            return 0.0
        u = self.table.unknown_union
        return (1.0 - self.a) * (u(self.count + tokens) - u(self.count))

    def slots(self, token: int) -> int:
        return self._masks.get(int(token)) or self._masks[-1]

    def gain(self, token: int) -> float:
        """New listed expert-layers if ``token`` joins the pass (its expected gain: ``a x`` this ``+``
        :meth:`more`)."""
        if self.table is None:
            return 0.0
        return float((self.slots(token) & ~self.seen).bit_count())

    def add(self, token: int) -> int:
        """Put ``token``'s experts in the pass; the slots that were new."""
        if self.table is None:
            return 0
        new = self.slots(token) & ~self.seen
        self.seen |= new
        self.n += new.bit_count()
        self.count += 1
        return new


class GoodputPolicy:
    """The per-step joint choice (see the module docstring). ``expert_cost = False``: the token-only variant;
    ``online = False``: the file's cost coefficients stay as they are (deterministic choices); ``plain_steps``:
    a step that verifies and proposes nothing skips vLLM's speculative machinery (no ``spec_pass`` cost)."""

    def __init__(self, spec: PolicySpec, num_speculative_tokens: int, *, expert_cost: bool = True,
                 online: bool = True, plain_steps: bool = False):
        self.spec = spec
        self.K = max(0, int(num_speculative_tokens))
        self.expert_cost = expert_cost and spec.table is not None
        self.cost = OnlineCost(spec.cost if self.expert_cost or spec.cost_tokens is None else spec.cost_tokens)
        self.online = online
        self.plain_steps = plain_steps
        self.acceptance = Acceptance(spec.prior, spec.prior_strength, spec.request_strength, max(self.K, 1))
        self.floor_run = 0  # consecutive steps that neither verified nor proposed a draft
        self.wait = PROBE_FIRST  # floor steps before the next probe
        self.probing: set[str] = set()  # requests whose drafts of this step were proposed as a probe
        self._chain_memo: dict[tuple[str, bool, int, bool], list[float]] = {}  # this step's (decide clears it)
        self._ref_memo: dict[tuple[int, int, int], tuple[int, int]] = {}  # batch kind -> (step, fixed K_next)
        self._grow_memo: dict[tuple[int, int], list[float]] = {}  # (rows, drafts) -> expected unions (_grow)
        self._steps = 0

    # -------------------------------------------------------------- pricing
    def _spec(self, speculates: bool) -> float:
        """The ``spec_pass`` unit of a step: paid when it speculates, or always without plain steps."""
        return 1.0 if speculates or not self.plain_steps else 0.0

    def _seconds(self, rows: int, tokens: float, union: float, kv: float, k_next: int, spec: float = 1.0,
                 sampled: float = 0.0) -> float:
        return self.cost.current.price(rows, tokens, union, kv, k_next, spec, sampled, self.expert_cost)

    def _base(self, rows: Sequence[Row], with_union: bool = True) -> tuple[_Union, float, float, float, float]:
        """The pass without drafts: its union (roots; prefill tokens as unknown ones; empty without
        ``with_union``), tokens, KV slots, the tokens it commits for sure (one per decode row) and the roots of
        sampled rows."""
        union = _Union(self.spec.table if self.expert_cost and with_union else None)
        tokens, kv, num, sampled = 0.0, 0.0, 0.0, 0.0
        for r in rows:
            tokens += r.extra_tokens + (1 if r.root is not None else 0)
            kv += r.context
            if r.root is not None:
                union.add(r.root)
                num += 1.0
                sampled += 1.0 if r.sampled else 0.0
        extra = sum(r.extra_tokens for r in rows)
        if self.expert_cost and with_union and extra:  # prefill tokens touch experts too (which: not known here)
            union.n += self._joint(union.n, min(extra, 64)) - union.n
            union.count += min(extra, 64)
        return union, tokens, kv, num, sampled

    def _joint(self, known: float, n_unknown: int) -> float:
        """Expected union of a known set of ``known`` expert-layers and ``n_unknown`` unknown tokens (taken as
        independent of the known set)."""
        t = self.spec.table
        total = t.num_layers * t.num_experts
        return known + t.unknown_union(n_unknown) * (1.0 - known / total)

    def _grow(self, rows: int, n: int) -> list[float]:
        """The expected union of ``rows`` unknown roots and 0..``n`` unknown drafts (it depends on the table only:
        memoised)."""
        g = self._grow_memo.get((rows, n))
        if g is None:
            if len(self._grow_memo) >= 4096:
                self._grow_memo.clear()
            u0 = self._joint(0.0, rows)
            g = self._grow_memo[(rows, n)] = [self._joint(u0, i) for i in range(n + 1)]
        return g

    def _chains(self, rows: Sequence[Row], n: int, pooled: bool = False) -> dict[str, list[float]]:
        """Per request its chain probabilities (memoised for the step: the plan and the choice read the same);
        ``pooled``: the shared rates, without the request's factor."""
        memo = self._chain_memo
        out = {}
        for r in rows:
            key = (r.req, r.sampled, n, pooled)
            c = memo.get(key)
            if c is None:
                c = memo[key] = self.acceptance.chain("sampled" if r.sampled else "greedy", r.req, n, pooled)
            out[r.req] = c
        return out

    def _coefs(self) -> tuple[float, float, float]:
        """Seconds per verified token, per expert-layer of the union (0 for the token-only variant), per token of
        a sampled request."""
        c = self.cost.current.coef
        return c["tokens"], (c["expert_layers"] if self.expert_cost else 0.0), c["sampled_tokens"]

    def _choose(self, rows: Sequence[Row], avail: dict[str, int], k_next: int, forced: Iterable[str] = ()
                ) -> tuple[dict[str, int], float, float, dict[str, float]]:
        """Greedy path over the proposed drafts (their experts known from the table); the best prefix. The
        ``forced`` requests (a probe's) verify all their drafts: the path starts there."""
        union, tokens, kv, num, smp = self._base(rows)
        chains = self._chains(rows, self.K)
        by = {r.req: r for r in rows}
        k = {r.req: 0 for r in rows}
        spec = self._spec(k_next > 0)
        t = self._seconds(len(rows), tokens, union.size(), kv, k_next, spec, smp)
        ar_rate = num / t if t > 0 else 0.0
        best = (ar_rate * (1 + self.spec.tolerance), dict(k), tokens, union.size(), spec, smp)
        c_tok, c_exp, c_smp = self._coefs()
        c_lst = c_exp * union.a  # per listed expert-layer a draft adds (the rest: union.more(), per draft)
        c_spec = self.cost.current.coef.get("spec_pass", 0.0)
        forced = [r for r in forced if avail.get(r, 0) > 0]
        if forced:
            t += c_spec if spec == 0 else 0.0
            spec = 1.0
            for req in forced:
                for i in range(avail[req]):
                    t += c_tok + (c_lst * union.gain(by[req].drafts[i]) + c_exp * union.more() if c_exp > 0
                                  else 0.0)
                    t += c_smp if by[req].sampled else 0.0
                    smp += 1.0 if by[req].sampled else 0.0
                    union.add(by[req].drafts[i])
                    num += chains[req][i]
                    tokens += 1
                k[req] = avail[req]
            best = (num / t, dict(k), tokens, union.size(), spec, smp)
        open_ = [q for q, n in avail.items() if k[q] < n]
        full = self._all_or_nothing(open_, k, avail, by, chains, union, (num, t, tokens, smp), best[0]) \
            if open_ and spec > 0 else None
        if full is not None:  # every open draft, or none where that does not beat the floor: no walk
            rate, tok_n, u_n, smp_n = full
            if rate > best[0]:
                best = (rate, {q: avail[q] if k[q] < avail.get(q, 0) else n for q, n in k.items()}, tok_n, u_n,
                        1.0, smp_n)
            open_ = []
        # The greedy path. Each open request's next draft keeps its gain current as the union grows (a gain only
        # falls by the slots an addition made new): one set operation per request and pick, not a gain per
        # candidate and pick; the path is kept as its picks (the best prefix's choice rebuilt once at the end).
        drafts = {q: by[q].drafts for q in open_}
        extra = {q: c_smp if by[q].sampled else 0.0 for q in open_}
        gains = {q: union.gain(drafts[q][k[q]]) if c_exp > 0 else 0.0 for q in open_}
        start, path, best_len, floor_rate, full_rate = dict(k), [], -1, best[0], 0.0
        while open_:
            # the step's first draft brings the speculative machinery; every draft the random part of its experts
            base = c_tok + (c_exp * union.more() if c_exp > 0 else 0.0) + (c_spec if spec == 0 else 0.0)
            pick, pick_rate, pick_cost = None, -1.0, 0.0
            for q in open_:
                cost = base + c_lst * gains[q] + extra[q]
                rate = (num + chains[q][k[q]]) / (t + cost)
                if rate > pick_rate:
                    pick, pick_rate, pick_cost = q, rate, cost
            i = k[pick]
            num += chains[pick][i]
            new = union.add(drafts[pick][i])
            k[pick] = i + 1
            if k[pick] >= avail[pick]:
                open_.remove(pick)
            if c_exp > 0:
                if k[pick] < avail[pick]:
                    gains[pick] = union.gain(drafts[pick][k[pick]])
                if new:
                    for q in open_:
                        if q != pick:
                            gains[q] -= (new & union.slots(drafts[q][k[q]])).bit_count()
            tokens += 1
            smp += 1.0 if by[pick].sampled else 0.0
            t += pick_cost
            spec = 1.0
            path.append(pick)
            full_rate = pick_rate
            if pick_rate > best[0]:
                best = (pick_rate, None, tokens, union.size(), spec, smp)
                best_len = len(path)
        if 0 <= best_len < len(path) and full_rate > floor_rate and full_rate * (1 + self.spec.tolerance) >= best[0]:
            # the guard band: verifying every proposed draft (what a fixed configuration does) unless a shorter
            # choice is expected to beat it by the tolerance (gains under it are inside the models' error)
            best, best_len = (full_rate, None, tokens, union.size(), spec, smp), len(path)
        if best_len >= 0:
            choice = start
            for q in path[:best_len]:
                choice[q] += 1
            best = (best[0], choice) + best[2:]
        rate, choice, tok_n, u_n, spec_n, smp_n = best
        shape = _shape(len(rows), tok_n, u_n, kv, k_next, spec_n, smp_n)
        return choice, (rate if any(choice.values()) else ar_rate), ar_rate, shape

    def _all_or_nothing(self, open_: list[str], k: dict[str, int], avail: dict[str, int], by: dict[str, Row],
                        chains: dict[str, list[float]], union: _Union, state: tuple[float, float, float, float],
                        floor: float) -> tuple[float, float, float, float] | None:
        """Where the greedy path would verify every open draft (or none), the rate, tokens, union and sampled
        tokens of all of them; else None (the path decides). Exact, for a step that speculates already (no
        ``spec_pass`` to bring); ``floor``: the rate a choice must beat (plain decoding's with the tolerance).

        With ``R`` the rate of all drafts verified, ``b`` the cost without them, and ``l_i`` per draft a cost such
        that every subset ``S`` of the drafts costs at least ``b + sum_{i in S} l_i`` and all of them exactly ``b +
        sum_i l_i``: any subset's rate is at most ``R + D / b``, ``D = sum_i max(0, R l_i - p_i)`` (``p_i`` the
        draft's chain probability; its tokens fall short of ``R`` times its cost by the rest's ``p_i - R l_i``).
        ``D = 0`` (every draft pays for itself at ``R``): no subset beats ``R``, so the path's best prefix is all
        of them, or none where ``R`` does not beat the floor. ``D <= tolerance x R x b`` and ``R`` over the floor:
        no prefix beats ``R`` by the tolerance, and the path's guard band verifies all of them. ``l_i``: the
        draft's token cost, sampled-token cost, an equal share of the random part of the drafts' experts
        (:meth:`_Union.more`, concave in their number), and each listed expert-layer it adds to the union without
        drafts at ``a x c_expert / m``, ``m`` the number of open drafts that add that expert-layer (one shared by
        ``m`` drafts is paid once however many of them a subset takes). Each draft is first charged its whole
        gain (no counting, an upper bound of ``l_i``); the shares are counted only where that leaves a shortfall.
        At T = 0 on the demo's draft nearly every step is decided here: one set operation per draft instead of
        one per open request and pick."""
        num, t0, tokens, smp = state
        c_tok, c_exp, c_smp = self._coefs()
        table = union.table is not None
        # the random part of the drafts' experts, an equal share each: concave in how many join, so a subset of
        # them adds at least its share (the bound below holds with it in l_i)
        n_open = sum(avail[q] - k[q] for q in open_)
        rand = union.more(n_open) if table else 0.0
        c_lst, c_rand = c_exp * union.a, c_exp * rand / max(n_open, 1)
        pending = []  # (chain probability, token and sampled cost, slots it adds to the union without drafts, their
        new = 0       # number)
        unseen = ~union.seen
        masks = union._masks
        fallback = masks.get(-1, 0)
        t = t0
        for q in open_:
            row, lo, hi = by[q], k[q], avail[q]
            c = chains[q][lo:hi]
            base = c_tok + (c_smp if row.sampled else 0.0) + c_rand
            if table:
                for d, p in zip(row.drafts[lo:hi], c):
                    s = (masks.get(d) or fallback) & unseen
                    new |= s
                    pending.append((p, base, s, s.bit_count()))
            else:
                pending.extend((p, base, 0, 0) for p in c)
            num += sum(c)
            tokens += len(c)
            smp += float(len(c)) if row.sampled else 0.0
            t += base * len(c)
        added = float(new.bit_count())
        t += c_lst * added
        rate = num / t if t > 0 else 0.0
        short = [d for d in pending if d[0] < rate * (d[1] + c_lst * d[3])]
        if short:
            slack = self.spec.tolerance * rate * t0 * (1.0 - 1e-9)  # the guard band's room, less rounding
            if not rate > floor * (1.0 + 1e-12) or self._shortfall(short, pending, rate, c_lst, slack) > slack:
                return None
        return rate, tokens, union.size() + union.a * added + rand, smp

    @staticmethod
    def _shortfall(short: list[tuple[float, float, int, int]], pending: list[tuple[float, float, int, int]],
                   rate: float, c_exp: float, slack: float) -> float:
        """``D`` of :meth:`_all_or_nothing` over the ``short`` drafts (chain probability, token cost, the slots it
        adds as bits and their number; those of ``pending`` that fall short when charged their whole gain):
        charged their whole gain where that is within ``slack``, else their shares."""
        d = sum(rate * (base + c_exp * n) - p for p, base, _, n in short)
        if d <= slack or c_exp <= 0:
            return d
        # per slot, how many pending drafts add it: a bit-sliced counter (bit j of the count in counts[j]) ...
        counts: list[int] = []
        every = 0
        for _, _, s, _ in pending:
            every |= s
            carry, j = s, 0
            while carry:
                if j == len(counts):
                    counts.append(0)
                c = counts[j]
                counts[j], carry = c ^ carry, c & carry
                j += 1
        # ... split by the counter's bits into the slots of each count present (~11 at batch 8, T = 0)
        groups = [(every, 0)] if every else []
        for j in range(len(counts) - 1, -1, -1):
            c, split = counts[j], []
            for m, n in groups:
                if m & c:
                    split.append((m & c, n | 1 << j))
                if m & ~c:
                    split.append((m & ~c, n))
            groups = split
        levels = [(m, 1.0 / n) for m, n in groups]
        return sum(max(0.0, rate * (base + c_exp * sum((s & e).bit_count() * w for e, w in levels)) - p)
                   for p, base, s, _ in short)

    def _plan(self, rows: Sequence[Row], least: int = 0) -> int:
        """K_next (at least ``least``): the best *fixed* proposal length for a batch of this kind (the best length
        for the shared acceptance rates, :meth:`_reference`) whenever it is expected to beat plain decoding for
        these requests (their own factors applied); else the best length for their factors (0: the floor).

        The requests' factors decide *whether* to speculate, not how far: vLLM proposes one length for the whole
        batch, and at batch 1, T = 0 on the demo's draft the fifth draft's expected gain sits within ~1 % of its
        cost, so a request's factor a little under 1 cut the proposal to 3-4 drafts in 15 % of steps even with a
        1 % guard band, and those cuts cost more steps than their draft passes saved (vLLM on a Zen 4, the same
        process: +2.2 % steps, 0.967x of four copies of the chain of five).

        Unknown drafts all add the same expected experts, so the greedy path takes them by descending chain
        probability and its union depends only on how many were taken. The next step's roots are unknown too
        (the tokens this step samples): their union is the expected one of as many unknown tokens, not the union of
        this step's roots (8 rows' first decode step often holds one token eight times: its union priced the floor
        at ~0.7x its measured cost, vLLM on a Zen 4, and every batch took its first 8 steps plain)."""
        ref = self._reference(rows, least)
        if ref > 0:
            rates = self._plan_rates(rows, least, pooled=False, lengths=(0, ref), over_floor=True)
            if rates[ref] > rates.get(0, -1.0):
                return ref
        return self._longest_within(self._plan_rates(rows, least, pooled=False))

    def _longest_within(self, rates: dict[int, float]) -> int:
        """The proposal length of the best rate (0 where the floor is best), or the longest non-zero length whose
        rate is within the tolerance of it: the guard band of :meth:`_choose` between proposal lengths too. A
        shorter proposal must beat a longer one by more than the models' error (vLLM at batch 8, T = 0 on a Zen 4:
        a proposal of 4 was expected 0.3 % over 5 under the exported cost, where vLLM's chain of 5 ran 4 % faster
        than its chain of 4; without the guard the plugin proposed 3-4 drafts in 61 of 114 plans, 4.13 tokens a
        step against the chain of 5's 4.70; with it, 5 in every step)."""
        best = max(rates, key=lambda kn: (rates[kn], -kn))
        if best == 0:
            return 0
        # within the tolerance of the best, and still over plain decoding's rate (which carries the tolerance)
        floor = max(rates[best] / (1 + self.spec.tolerance), rates.get(0, -1.0))
        return max(kn for kn, r in rates.items() if kn > 0 and r >= floor)

    def _reference(self, rows: Sequence[Row], least: int) -> int:
        """The best fixed proposal length for a batch of this kind (rows, sampled rows, ``least``): kept for
        ``REF_STEPS`` steps (it moves only with the shared rates and the cost refit; planning it again every step
        cost ~20 us of host work)."""
        key = (len(rows), sum(r.sampled for r in rows), least)
        hit = self._ref_memo.get(key)
        if hit is not None and self._steps - hit[0] < REF_STEPS:
            return hit[1]
        ref = self._longest_within(self._plan_rates(rows, least, pooled=True))
        self._ref_memo[key] = (self._steps, ref)
        return ref

    def _plan_rates(self, rows: Sequence[Row], least: int, pooled: bool, lengths: Iterable[int] | None = None,
                    over_floor: bool = False) -> dict[int, float]:
        """Proposal length ``K_next`` in ``min(least, K)..K`` (only those of ``lengths`` where given) -> its
        expected rate (plain decoding's with the tolerance). ``over_floor``: a length's rate may instead be any
        rate it reaches above plain decoding's (that of all its drafts verified, when that is above: no sort, no
        walk over the drafts; :meth:`_plan` only asks whether a length beats the floor)."""
        _, tokens, kv, num, smp = self._base(rows, with_union=False)
        chains = self._chains(rows, self.K, pooled)
        c_tok, c_exp, c_smp = self._coefs()
        # the cost is linear in the shape: the proposal adds its draft passes and, where it speculates, the
        # speculative machinery to the pass priced once
        n_all = sum(len(c) for c in chains.values())
        grow = self._grow(len(rows), n_all) if c_exp > 0 else [0.0] * (n_all + 1)
        t_base = self._seconds(len(rows), tokens, grow[0], kv, 0, 0.0, smp)
        coef = self.cost.current.coef
        c_draft, c_spec = coef.get("draft_steps", 0.0), coef.get("spec_pass", 0.0)
        span = range(min(least, self.K), self.K + 1)
        todo = [kn for kn in (span if lengths is None else lengths) if kn in span]
        rates = {}
        if 0 in todo:
            rates[0] = num / (t_base + c_spec * self._spec(False)) * (1 + self.spec.tolerance)
        order = None
        for kn in todo:
            if kn == 0:
                continue
            t = t_base + c_draft * kn + c_spec * self._spec(True)
            if over_floor:
                got, n, sampled_n = num, 0, 0
                for r in rows:
                    c = chains[r.req][:kn]
                    got += sum(c)
                    n += len(c)
                    sampled_n += len(c) if r.sampled else 0
                r_all = got / (t + c_smp * sampled_n + c_tok * n + c_exp * (grow[n] - grow[0] if c_exp > 0 else 0.0))
                if r_all > rates.get(0, -1.0) * (1 + 1e-12):
                    rates[kn] = r_all
                    continue
            if order is None:
                sampled = {r.req: r.sampled for r in rows}
                order = sorted(((p, i, sampled[q]) for q, c in chains.items() for i, p in enumerate(c)),
                               key=lambda x: -x[0])
            rate, got, n = -1.0, num, 0
            for p, i, is_sampled in order:
                if i >= kn:
                    continue
                got += p
                n += 1
                t += c_smp if is_sampled else 0.0
                r = got / (t + c_tok * n + c_exp * (grow[n] - grow[0] if c_exp > 0 else 0.0))
                rate = max(rate, r)
            rates[kn] = rate
        return rates

    # -------------------------------------------------------------- the step
    def decide(self, rows: Sequence[Row]) -> Decision:
        """This step's drafts per request (each ``<= len(row.drafts)``), and the drafts to propose next.

        ``K_next`` is planned first (the next step's drafts are unknown: expected experts); this step's choice is
        then priced with the draft passes ``K_next`` costs after it (a step = this pass + the next proposal)."""
        rows = list(rows)
        self._chain_memo.clear()
        self._steps += 1
        quiet = self._floor_step(rows)
        if quiet is not None:
            return quiet
        plan_rows = [Row(r.req, [], r.root if r.root is not None else 0, r.context + 1, r.sampled) for r in rows]
        k_next = self._plan(plan_rows) if plan_rows and self.K > 0 else 0
        avail = {r.req: min(len(r.drafts), self.K) for r in rows}
        forced, self.probing = self.probing, set()
        choice, rate, ar_rate, shape = self._choose(rows, avail, k_next, forced)
        decoding = [r.req for r in rows if r.root is not None and r.extra_tokens == 0]
        if k_next > 0 or any(choice.values()) or not decoding:
            if k_next > 0:
                self.wait = PROBE_FIRST
            self.floor_run = 0
        else:
            self.floor_run += 1
            if self.floor_run >= self.wait:  # probe: propose drafts, verify them all next step
                k_next = self._plan(plan_rows, least=1)
                choice, rate, ar_rate, shape = self._choose(rows, avail, k_next)
                self.probing = set(decoding)
                self.floor_run = 0
                self.wait = min(2 * self.wait, PROBE_MAX)
        return Decision(choice, k_next, rate, ar_rate, shape)

    def _floor_step(self, rows: list[Row]) -> Decision | None:
        """On the floor between probes (no drafts held, no prefill, no probe pending): the floor's decision without
        planning (the plan is made again at the probe; its inputs only change through the cost refit, every 64
        steps). A floor step's host work is then a few microseconds, not the plan's ~0.06 ms (vLLM on a Sapphire
        Rapids, batch 1, T = 1: the plugin's floor step cost ~0.8 ms more than vLLM without speculation)."""
        if not (0 < self.floor_run < self.wait - 1) or self.probing:
            return None
        if any(r.drafts or r.extra_tokens or r.root is None for r in rows):
            return None
        union, tokens, kv, num, smp = self._base(rows)
        spec = self._spec(False)
        shape = _shape(len(rows), tokens, union.size(), kv, 0, spec, smp)
        t = self.cost.current.seconds(shape, self.expert_cost)
        self.floor_run += 1
        rate = num / t if t > 0 else 0.0
        return Decision({r.req: 0 for r in rows}, 0, rate, rate, shape, t)

    def floor_step_unpriced(self) -> bool:
        """A floor step that the caller does not price, where :meth:`decide` would take its floor fast path (between
        probes, none pending): counted as that path counts it, so the probes come when they would. False (and
        nothing counted) elsewhere: the step must then go through :meth:`decide`."""
        if not (0 < self.floor_run < self.wait - 1) or self.probing:
            return False
        self.floor_run += 1
        self._steps += 1
        return True

    def holds(self, remaining: Iterable[int]) -> bool:
        """After :meth:`decide`, for a step that verifies and proposes nothing: whether the drafter should keep
        the step's rows (:mod:`specmoe_vllm.drafter`) for the next step that drafts. ``remaining``: per request of
        the step, the most tokens it may still generate. Only a request still decoding at the next probe reads
        them: false where the back-off is longer than every request can live (the rows would never be read, and
        holding costs a floor step ~0.1 ms of host work), true otherwise."""
        if self.probing:
            return True
        left = self.wait - self.floor_run  # steps to the next probe
        return any(n >= left for n in remaining)

    # -------------------------------------------------------------- feedback
    def observe_step(self, results: Iterable[tuple[str, bool, int, int]]) -> None:
        """Per verified request: (request, sampled, drafted, accepted)."""
        for req, sampled, drafted, accepted in results:
            self.acceptance.observe("sampled" if sampled else "greedy", req, drafted, accepted)

    def observe_time(self, shape: dict[str, float], seconds: float) -> None:
        if self.online:
            self.cost.observe(shape, seconds)

    def finished(self, req: str) -> None:
        self.acceptance.forget(req)
