# SPDX-License-Identifier: Apache-2.0
"""The EAGLE-3 draft's inference step as one compiled function on CPUs: :meth:`Eagle3Model.step_into` and the
log-probabilities of every new input, in a few generated loops instead of ~130 framework operations.

A draft's rounding never decides what is committed (verification does), so the step is free to take whatever
kernels are faster for its number of rows and dtype: one input (a chain's step) takes explicit reductions, one
generated loop per output element; two to :data:`ROW_KERNEL_ROWS` inputs (absorbing the accepted tokens, a tree's
level) take the row kernels' products (:mod:`specmoe.kernels.row_kernels`, float32 and bf16, where they build:
each weight row read once for a block of four inputs), up to :data:`COMPILED_MAX_ROWS_REDUCED` bf16 inputs on a
CPU without oneDNN's bf16 kernels; otherwise several inputs in bf16 / fp16 take BLAS products inside the graph
(each weight read once for all rows; a variant of its own) and several in float32 the explicit reductions, which
were faster than the graph's float32 BLAS calls there (:data:`COMPILED_MAX_ROWS`). The computation is
:meth:`Eagle3Model.step_into` followed by ``log_softmax(logits)`` (tested equal to rounding). A pool of frontier
width one (a chain, ``top_k = 1``, or a chain with each level's runner-ups, ``frontier: 1``) is drafted by one
compiled call of all its steps below the root (:meth:`CompiledStep.chain`, :func:`_chain_fn`; the same tree as the
pool built level by level), a variant per number of levels and candidates. A rotary type
whose tables change with the sequence, a GPU, ``SPECMOE_COMPILE=0`` or a failure to compile keep the eager
step (the failure said once in the log).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from specmoe.kernels import row_kernels
from specmoe.models import linear
from specmoe.models.compiling import compile_fn, dynamic, enabled, failure, project, standard, structure_generation
from specmoe.models.rope import RopeTables, static

__all__ = ["CompiledStep", "COMPILED_MAX_ROWS", "COMPILED_MAX_ROWS_REDUCED", "ROW_KERNEL_ROWS"]

logger = logging.getLogger(__name__)

#: the most inputs (``B * N``) a float32 compiled step takes: its products are explicit reductions, one loop per
#: output element and row, so their cost grows with the rows, where the eager step's BLAS products read each
#: weight once for all rows (demo draft, 2-core Zen 4, one thread, paired in one process: 1 input 0.27 ms
#: compiled / 0.54 ms eager; 5 inputs 0.74 / 1.29 ms; 12 inputs 1.54 / 1.36 ms; 40 inputs 5.3 / 2.9 ms)
COMPILED_MAX_ROWS = 6

#: the same for bf16 / fp16 drafts, whose several-input variant takes BLAS products in the graph (same machine:
#: 1 input 0.36 ms compiled / 0.91 ms eager; 5 inputs 0.65 / 0.99 ms; 40 inputs 1.43 / 2.06 ms; 200 inputs
#: 7.5 / 8.9 ms; the explicit reductions took 1.13 ms for 5 inputs)
COMPILED_MAX_ROWS_REDUCED = 256


#: two to this many inputs take the row kernels' products (:mod:`specmoe.kernels.row_kernels`: each weight row read
#: once for a block of up to four inputs) where they build, in float32 and bf16; on a CPU without oneDNN's bf16
#: kernels (AVX2 only) a bf16 draft takes them up to COMPILED_MAX_ROWS_REDUCED inputs. One input keeps the explicit
#: reductions. Demo draft, 2-core Zen 3 (AVX2), one thread, paired in one process, row kernels / before: float32
#: 1 input 0.86 / 0.68 ms, 2: 0.98 / 0.87, 4: 1.12 / 1.26, 8: 1.56 / 2.02 (eager), 20: 2.72 / 2.87 (eager),
#: 40: 4.25 / 3.73 (eager); bf16 4 inputs 1.03 / 1.98 ms, 12: 2.14 / 5.31, 40: 4.85 / 16.3 (BLAS in the graph)
ROW_KERNEL_ROWS = 32


@dataclasses.dataclass(frozen=True)
class _Spec:
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    scale: float
    norm_before_residual: bool
    act: Any


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


def _step(spec: _Spec, w: dict, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
          cos_table: torch.Tensor, sin_table: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
          allowed: torch.Tensor):
    """``tokens [B, N]``, ``hidden [B, N, H]``, ``positions [B, N]``, the caches ``[B, H_kv, C, D]`` (the ``N``
    new keys / values written at slots ``S .. S + N``), ``allowed [B, N, S + N]`` -> ``(out [B, N, H],
    log-probabilities [B, N, V_draft] float32)``."""
    b, n = tokens.shape
    total = allowed.shape[-1]
    hq, hkv, d = spec.heads, spec.kv_heads, spec.head_dim
    row = w.get("rows")  # input-major copies for the row kernels (CompiledStep._row_weights), or None
    blas = row is None and b * n > 1 and w["q"].dtype != torch.float32  # see the module docstring

    def lin(x: torch.Tensor, name: str) -> torch.Tensor:
        if row is not None:
            y = torch.ops.specmoe.row_linear(x.float().flatten(0, -2), *row[name])
            return y.view(*x.shape[:-1], y.shape[-1]).to(x.dtype)
        weight, bias = w[name], w[f"{name}_b"]
        if blas:
            return torch.nn.functional.linear(x, weight, bias)
        return project(x, weight, bias).to(x.dtype)

    emb = w["embed"][tokens].to(hidden.dtype)
    h_norm = _rms(hidden, w["hidden_norm"], spec.eps)
    x = torch.cat([_rms(emb, w["input_norm"], spec.eps), h_norm], dim=-1)
    if row is not None:
        q, k, v = lin(x, "qkv").split([hq * d, hkv * d, hkv * d], dim=-1)
    else:
        q, k, v = lin(x, "q"), lin(x, "k"), lin(x, "v")
    q = q.view(b, n, hq, d).transpose(1, 2)
    k, v = k.view(b, n, hkv, d).transpose(1, 2), v.view(b, n, hkv, d).transpose(1, 2)
    cos, sin = cos_table[positions][:, None], sin_table[positions][:, None]
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    slots = torch.arange(n, device=cache_k.device) + (total - n)
    cache_k.index_copy_(2, slots, k.to(cache_k.dtype))
    cache_v.index_copy_(2, slots, v.to(cache_v.dtype))
    keys, values = cache_k.narrow(2, 0, total), cache_v.narrow(2, 0, total)
    rep = hq // hkv
    mask = allowed[:, None, None].expand(b, hkv, rep, n, total).reshape(b, hkv, rep * n, total)
    att = torch.nn.functional.scaled_dot_product_attention(q.reshape(b, hkv, rep * n, d), keys, values,
                                                           attn_mask=mask, scale=spec.scale)
    flat = att.reshape(b, hq, n, d).transpose(1, 2).reshape(b, n, hq * d)
    h = (h_norm if spec.norm_before_residual else hidden) + lin(flat, "o")
    y = _rms(h, w["post_norm"], spec.eps)
    if row is not None:
        gate, up = lin(y, "gate_up").chunk(2, dim=-1)
    else:
        gate, up = lin(y, "gate"), lin(y, "up")
    out = h + lin(spec.act(gate) * up, "down")
    normed = _rms(out, w["norm"], spec.eps)
    if row is not None:
        flat = normed.float().flatten(0, -2)
        logits = torch.ops.specmoe.row_linear(flat, *row["lm_head"]).view(b, n, -1)
    elif blas:
        logits = torch.nn.functional.linear(normed, w["lm_head"]).float()
    else:
        logits = project(normed, w["lm_head"])
    return out, torch.log_softmax(logits, dim=-1)


def _chain_fn(steps: int, top_k: int):
    """A pool of frontier width one (``steps`` levels, ``top_k`` candidates each: the chain of the likeliest
    tokens and each level's runner-ups) as one function of tensors: the ``steps - 1`` draft steps below the root
    unrolled, so its draft is one compiled call (each separate call of the compiled step costs ~0.2 ms of the
    framework's own work beside its ~0.3 ms of products, and the per-level Python of the pool builder ~0.5 ms
    more; demo draft, Zen 3)."""

    def chain(spec: _Spec, w: dict, d2t: torch.Tensor, root_hidden: torch.Tensor, root_logp: torch.Tensor,
              root_pos: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, cache_k: torch.Tensor,
              cache_v: torch.Tensor, context: torch.Tensor):
        """``root_hidden [B, H]``, ``root_logp [B, V_draft]``, ``root_pos [B]``, ``context [B, C]`` (the context
        slots each row sees; the keys / values of the expanded nodes are written at slots ``C .. C + steps - 1``)
        -> ``(tokens [B, steps, top_k]`` target ids of each level's candidates, likeliest first, ``logp [B,
        steps, top_k]`` their edge log-probabilities, ``hidden [B, steps - 1, H]`` the outputs of the steps that
        consumed the likeliest candidate of levels 1 .. steps - 1)."""
        b = root_hidden.shape[0]
        lp, tok = root_logp.float().topk(top_k, dim=-1)
        tokens, logps, outs = [tok + d2t[tok]], [lp], []
        hidden = root_hidden[:, None]
        seen = context[:, None, :]
        for i in range(steps - 1):
            seen = torch.cat([seen, torch.ones(b, 1, 1, dtype=torch.bool, device=seen.device)], dim=2)
            hidden, logp = _step(spec, w, tokens[-1][:, :1], hidden, (root_pos + (i + 1))[:, None], cos_table,
                                 sin_table, cache_k, cache_v, seen)
            outs.append(hidden)
            lp, tok = logp[:, 0].topk(top_k, dim=-1)
            tokens.append(tok + d2t[tok])
            logps.append(lp)
        return torch.stack(tokens, dim=1), torch.stack(logps, dim=1), torch.cat(outs, dim=1)

    return chain


class CompiledStep:
    """The compiled step of one draft model (see the module docstring); built lazily by :meth:`build`."""

    def __init__(self, model: Any) -> None:
        c = model.config
        self.model = model
        self.spec = _Spec(heads=c.num_attention_heads, kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                          eps=float(model.norm.eps), scale=float(model.scale),
                          norm_before_residual=bool(c.norm_before_residual), act=model.midlayer.mlp.act)
        self._fn = compile_fn(_step)
        self._rope: RopeTables | None = None
        self.off = False
        dtype = model.fc.weight.dtype
        self.row = dtype in row_kernels.DTYPES and row_kernels.available()
        self._row_read: tuple[tuple, dict] | None = None  # (the sources' stamps, :meth:`_row_weights`)
        #: the most inputs whose products take the row kernels (from two on; see ROW_KERNEL_ROWS)
        self.row_max = 0 if not self.row else (
            ROW_KERNEL_ROWS if dtype == torch.float32 or linear.onednn_bf16() else COMPILED_MAX_ROWS_REDUCED)
        self.max_rows = max(COMPILED_MAX_ROWS, self.row_max) if dtype == torch.float32 \
            else COMPILED_MAX_ROWS_REDUCED
        self._read: tuple[int, dict] | None = None  # (structure generation, :meth:`_weights`)
        self._compiled: set[tuple[int, bool]] = set()  # (batch, one input) of the variants compiled
        self._chains: dict[tuple[int, int], Any] = {}  # (steps, top_k) -> the compiled chain (:func:`_chain_fn`)
        self._chained: set[tuple[int, int, int]] = set()  # (batch, steps, top_k) of the chain variants compiled

    @classmethod
    def build(cls, model: Any) -> CompiledStep | None:
        """A compiled step for ``model``, or ``None`` where the eager step runs (a GPU, a rotary type whose
        tables change, ``SPECMOE_COMPILE=0``)."""
        if not enabled() or model.fc.weight.device.type != "cpu" or not static(model.rotary):
            return None
        return cls(model)

    def _weights(self) -> dict:
        """The draft's own tensors by name, read from its modules again after any module's parameters, buffers
        or submodules were reassigned (:func:`~specmoe.models.compiling.structure_generation`)."""
        gen = structure_generation()
        if self._read is None or self._read[0] != gen:
            self._read = (gen, self._read_weights())
        return self._read[1]

    def _read_weights(self) -> dict:
        m = self.model
        layer, att, mlp = m.midlayer, m.midlayer.self_attn, m.midlayer.mlp
        linears = {"q": att.q_proj, "k": att.k_proj, "v": att.v_proj, "o": att.o_proj, "gate": mlp.gate_proj,
                   "up": mlp.up_proj, "down": mlp.down_proj}
        w = {name: layer_.weight for name, layer_ in linears.items()}
        w.update({f"{name}_b": layer_.bias for name, layer_ in linears.items()})
        w.update(embed=m.embed_tokens.weight, hidden_norm=layer.hidden_norm.weight,
                 input_norm=layer.input_layernorm.weight, post_norm=layer.post_attention_layernorm.weight,
                 norm=m.norm.weight, lm_head=m.lm_head.weight, lm_head_b=None)
        return w

    def _row_weights(self, w: dict) -> dict | None:
        """The products' input-major copies for :func:`~specmoe.kernels.row_kernels.row_linear` by name (``qkv``,
        ``o``, ``gate_up``, ``down``, ``lm_head``: ``(weight [in, out], bias or None)``), or ``None`` where the
        row kernels are not used; made again when a weight changes (storage or version counter)."""
        if not self.row:
            return None
        names = ("q", "k", "v", "o", "gate", "up", "down", "lm_head")
        sources = [w[x] for x in names] + [w[f"{x}_b"] for x in names]
        stamp = tuple(None if t is None else (t.data_ptr(), t._version) for t in sources)
        if self._row_read is not None and self._row_read[0] == stamp:
            return self._row_read[1]

        def fused(*parts: str) -> tuple:
            weights = [w[x].detach() for x in parts]
            biases = [w[f"{x}_b"] for x in parts]
            bias = None if all(b is None for b in biases) else torch.cat(
                [b.detach() if b is not None else wt.new_zeros(wt.shape[0]) for wt, b in zip(weights, biases)])
            return torch.cat(weights).t().contiguous(), bias

        with torch.no_grad():
            out = {"qkv": fused("q", "k", "v"), "o": fused("o"), "gate_up": fused("gate", "up"),
                   "down": fused("down"), "lm_head": fused("lm_head")}
        self._row_read = (stamp, out)
        return out

    def _rope_tables(self, like: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.model
        if self._rope is None or self._rope.rotary is not m.rotary:  # the loader may swap in its own rotary
            self._rope = RopeTables(m.rotary, self.spec.head_dim)
        return self._rope.table(like, length)

    def chain(self, root_hidden: torch.Tensor, root_logp: torch.Tensor, root_pos: torch.Tensor,
              cache_k: torch.Tensor, cache_v: torch.Tensor, context: torch.Tensor, steps: int, top_k: int = 1):
        """A pool of frontier width one over ``steps >= 2`` levels in one compiled call (:func:`_chain_fn`: the
        same steps as :meth:`__call__` over one input per row): ``(tokens [B, steps, top_k], logp [B, steps,
        top_k], hidden [B, steps - 1, H])``, or ``None`` (the caller builds the pool level by level) once
        compiling failed. The caches must have ``steps - 1`` free slots after ``context [B, C]``."""
        if self.off:
            return None
        b, n_ctx = context.shape
        cos, sin = self._rope_tables(root_hidden, n_ctx + steps)
        root_hidden, root_logp, root_pos, context = (standard(t) for t in (root_hidden, root_logp, root_pos,
                                                                           context))
        key = (b, steps, top_k)
        if key not in self._chained:
            dynamic(context, 1)
            for t in (cos, sin):
                dynamic(t, 0)
            for t in (cache_k, cache_v):
                dynamic(t, 2)
        try:
            fn = self._chains.get((steps, top_k))
            if fn is None:
                fn = self._chains[steps, top_k] = compile_fn(_chain_fn(steps, top_k))
            w = self._weights()
            w = {**w, "rows": self._row_weights(w) if self.row and 2 <= b <= self.row_max else None}
            out = fn(self.spec, w, self.model.d2t, root_hidden, root_logp, root_pos, cos, sin, cache_k, cache_v,
                     context)
            self._chained.add(key)
            return out
        except Exception as exc:  # as __call__: the level-by-level pool stays
            self.off = True
            logger.warning("EAGLE-3 draft chain: %s; the eager step runs", failure(exc))
            return None

    def __call__(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                 cache_k: torch.Tensor, cache_v: torch.Tensor, start: int,
                 allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:meth:`Eagle3Model.step_into` with the log-probabilities of every new input, or ``None`` (the caller
        runs the eager step) once compiling failed."""
        if self.off:
            return None
        n = tokens.shape[1]
        cos, sin = self._rope_tables(hidden, start + n)
        tokens, hidden, positions, allowed = (standard(t) for t in (tokens, hidden, positions, allowed))
        row = self.row and 2 <= tokens.numel() <= self.row_max
        key = (tokens.shape[0], n == 1, row)
        if key not in self._compiled:  # a variant may compile here; later calls match it unmarked
            for t in (tokens, hidden, positions):
                dynamic(t, 1)
            dynamic(allowed, 1, 2)
            for t in (cos, sin):
                dynamic(t, 0)
            for t in (cache_k, cache_v):
                dynamic(t, 2)
        try:
            w = self._weights()
            w = {**w, "rows": self._row_weights(w) if row else None}
            out = self._fn(self.spec, w, tokens, hidden, positions, cos, sin, cache_k, cache_v, allowed)
            self._compiled.add(key)
            return out
        except Exception as exc:  # a compiler missing or failing on this machine: the eager step stays
            self.off = True
            logger.warning("EAGLE-3 draft step: %s; the eager step runs", failure(exc))
            return None
