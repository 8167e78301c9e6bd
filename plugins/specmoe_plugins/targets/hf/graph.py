# SPDX-License-Identifier: Apache-2.0
"""A Hugging Face MoE target's decoding passes as one compiled graph (CPUs).

Why: on a CPU a decoding pass of a small target is mostly framework overhead. The lean decoder
(:mod:`specmoe_plugins.targets.hf.lean`) runs ~400 PyTorch operations per one-token pass of the demo target
(4 layers, 32 experts top-4), a few microseconds each, beside the weight reads; vLLM runs the same network in
fewer, fused calls. Here the whole pass is one function of tensors (:func:`_decode_pass`) that ``torch.compile`` turns
into a handful of generated C++ loops: the tree masks over the cached slots (the same function as
:meth:`KVState.masks <specmoe.interfaces.kv.KVState.masks>`), the rotary tables' rows, per layer the norms, the
q/k/v products, the rotary embedding, the write of the new keys and values into the preallocated slot buffers,
grouped attention (GPT-OSS sinks included), the output product, the model's own router module (traced; its
``F.linear`` computed by :func:`row_linear`, :class:`RowInvariantLinear`) and the installed verifier's experts
(its :class:`~specmoe.interfaces.verifier.GraphExperts`, or the experts module called as it is, an opaque step),
and at the end the final norm and the LM head of every row. Measured on the demo target: README, "The compiled
decoding pass".

Row invariance (what keeps speculation lossless): an autoregressive step and a verification pass must give a row the
same result. Every product is either an explicit reduction (:func:`row_linear` /
:func:`~specmoe.models.compiling.project`, the attention's two products, the router), which inductor generates as
one loop per output element, the same for any number of rows, or a row-invariant kernel of
:mod:`specmoe.kernels.row_kernels` (in float32 and bf16 where it builds: the q|k|v, output and LM-head products and
the experts, each output a running sum over the inputs in order, whatever rows share the call); nothing goes to a
BLAS whose kernel (and summation order) follows the row count. A compiled size of one would be a constant with its
own generated code, so a one-token pass runs as two tokens (:func:`_two_rows`); the sinks come first in the
attention's softmax, so every slot keeps its lane in the vectorised sums whatever the number of slots. A trial at
first use (:meth:`GraphDecoder._trial`) checks on the machine that each row of a multi-row pass equals the same row
computed alone; where it does not, or where compiling fails (no C++ compiler, an unsupported operation), the eager
lean path runs every pass, said once in the log.

Which passes: every pass into a non-empty cache of at most :data:`MAX_ROWS` rows (the autoregressive steps,
verification passes, the AR floor's steps) of a target whose verifier allows it
(:meth:`Verifier.compiled_passes <specmoe.interfaces.verifier.Verifier.compiled_passes>`: ``torch_union`` on
CPUs); prompt passes keep the eager lean path (the same for the autoregressive reference and speculation).
``SPECMOE_COMPILE=0`` switches the compiled passes off (:mod:`specmoe.models.compiling`).
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from typing import Any, Callable, Sequence

import torch
from torch.overrides import TorchFunctionMode

from specmoe.kernels import row_kernels
from specmoe.models.compiling import compile_fn, dynamic, enabled, failure, project, standard, structure_generation
from specmoe.models.rope import static

__all__ = ["GraphDecoder", "row_linear", "RowInvariantLinear", "MAX_ROWS"]

logger = logging.getLogger(__name__)

#: passes of more rows (batch x new tokens) than this keep the eager lean path
MAX_ROWS = 1024

#: rows of the first-use trial (:meth:`GraphDecoder._trial`)
TRIAL_ROWS = 4


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` in float32 as an explicit reduction: ``x [..., in]``, ``weight [out, in]``
    -> float32 ``[..., out]``. Compiled, each output element is one loop over ``in`` whatever the number of
    rows."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).float()
    y = (x2[:, None, :] * weight.float()[None, :, :]).sum(-1)  # [M, out]
    if bias is not None:
        y = y + bias.float()
    return y.view(*lead, weight.shape[0])


class RowInvariantLinear(TorchFunctionMode):
    """Inside it, ``F.linear`` is :func:`row_linear` (cast back to the input's dtype): how a model's own module
    (its router) is traced into the graph without a row-count-dependent BLAS call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return row_linear(x, weight, bias).to(x.dtype)
        return func(*args, **kwargs)


#: experts modules the compiled passes call, by key (a custom operator takes tensors and numbers, not modules)
_EXPERTS: "weakref.WeakValueDictionary[int, torch.nn.Module]" = weakref.WeakValueDictionary()


@torch.library.custom_op("specmoe::experts", mutates_args=())
def _experts(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
             key: int) -> torch.Tensor:
    """The experts module registered under ``key`` called as it is (its forward hooks, the experts implementation
    its verifier installed): ``hidden [T, H]``, ``top_k_index [T, K]``, ``top_k_weights [T, K]`` -> ``[T, H]``.
    An opaque call inside the compiled pass: the verifier's own computation, host reads included."""
    return _EXPERTS[key](hidden, top_k_index, top_k_weights)


@_experts.register_fake
def _(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, key: int) -> torch.Tensor:
    return torch.empty_like(hidden)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The supported models' RMSNorm: float32 statistics and weight, cast back to ``x``'s dtype."""
    xf = x.float()
    return (weight.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


@dataclasses.dataclass(frozen=True)
class _Spec:
    """The constants of one target's pass (guarded by value when compiled)."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    scaling: float
    qk_norm: bool
    sinks: bool
    attn_float: bool
    windows: tuple
    """the distinct attention windows (``None``: full attention), one mask each"""
    layer_window: tuple
    """per layer, the index of its window in :attr:`windows`"""


def _attention(spec: _Spec, x: torch.Tensor, w: Sequence[Any], cos: torch.Tensor, sin: torch.Tensor,
               kbuf: torch.Tensor, vbuf: torch.Tensor, mask: torch.Tensor, lin: tuple | None) -> torch.Tensor:
    """One attention layer of ``x [B, N, H]`` (normalized), ``mask [B, 1, N, S + N]`` additive over the ``S``
    cached slots and the new ones, ``cos, sin [B, N, D]``: writes the new keys / values at slots ``S .. S + N``
    of ``kbuf, vbuf [B, H_kv, C, D]``, attends over ``0 .. S + N`` and returns the output projection
    ``[B, N, H]`` in ``x``'s dtype. ``lin``: the layer's :meth:`GraphDecoder._row_weights` (the projections by
    :func:`specmoe.kernels.row_kernels.row_linear`), or ``None`` (explicit reductions)."""
    _, q_w, q_b, k_w, k_b, v_w, v_b, q_norm, k_norm, o_w, o_b, sinks, _ = w
    b, n, hidden = x.shape
    total = mask.shape[-1]
    d, hq, hkv = spec.head_dim, spec.heads, spec.kv_heads
    rep = hq // hkv
    if lin is not None:
        qkv = torch.ops.specmoe.row_linear(x.float().flatten(0, 1), lin[0], lin[1]).to(x.dtype)
        q, k, v = (t.view(b, n, -1, d) for t in qkv.split([hq * d, hkv * d, hkv * d], dim=-1))
    else:
        q = project(x, q_w.view(hq, d, hidden), None if q_b is None else q_b.view(hq, d)).to(x.dtype)
        k = project(x, k_w.view(hkv, d, hidden), None if k_b is None else k_b.view(hkv, d)).to(x.dtype)
        v = project(x, v_w.view(hkv, d, hidden), None if v_b is None else v_b.view(hkv, d)).to(x.dtype)
    if spec.qk_norm:
        q, k = _rms(q, q_norm, spec.eps), _rms(k, k_norm, spec.eps)
    cos, sin = cos[:, :, None], sin[:, :, None]
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)  # [B, N, heads, D]
    slots = torch.arange(n, device=kbuf.device) + (total - n)
    kbuf.index_copy_(2, slots, k.to(kbuf.dtype).transpose(1, 2))
    vbuf.index_copy_(2, slots, v.to(vbuf.dtype).transpose(1, 2))
    keys = kbuf.narrow(2, 0, total).float()  # [B, H_kv, S + N, D] (narrow: an exact size, no clamping)
    values = vbuf.narrow(2, 0, total).float()
    qg = q.float().unflatten(2, (hkv, rep))[:, :, :, :, None]  # [B, N, H_kv, rep, 1, D]: a KV head's group
    scores = (qg * keys[:, None, :, None]).sum(-1) * spec.scaling  # [B, N, H_kv, rep, S + N]
    scores = scores + mask.float()[:, 0, :, None, None]
    if spec.sinks:
        sink = sinks.float().unflatten(0, (hkv, rep))[None, None, :, :, None].expand(b, n, hkv, rep, 1)
        # the sink first: every slot keeps its lane in the vectorised sums whatever the number of slots
        probs = torch.softmax(torch.cat([sink, scores], dim=-1), dim=-1)[..., 1:]
    else:
        probs = torch.softmax(scores, dim=-1)
    if not spec.attn_float:  # the model's dtype, as its eager attention rounds the probabilities
        probs = probs.to(x.dtype).float()
    out = (probs[..., None] * values[:, None, :, None]).sum(-2).to(x.dtype)  # [B, N, H_kv, rep, D]
    if lin is not None:
        return torch.ops.specmoe.row_linear(out.float().reshape(b * n, hq * d), lin[2], lin[3]).view(
            b, n, hidden).to(x.dtype)
    y = (out.float()[:, :, None] * o_w.view(hidden, hkv, rep, d).float()).sum((-3, -2, -1))
    return (y if o_b is None else y + o_b.float()).to(x.dtype)


def _decode_pass(spec: _Spec, ids: torch.Tensor, positions: torch.Tensor, cos_table: torch.Tensor,
                 sin_table: torch.Tensor, kv_pos: torch.Tensor, kv_valid: torch.Tensor, attend: torch.Tensor,
                 valid: torch.Tensor, kbufs: list, vbufs: list, embed: torch.Tensor, layers: list, routers: list,
                 experts: list, experts_weights: list, final_norm: torch.Tensor, head: torch.Tensor,
                 head_bias: torch.Tensor | None, row_weights: list | None):
    """The whole pass (see the module docstring) over ``ids [B, N]`` at ``positions [B, N]`` (``attend
    [B, N, N]``, ``valid [B, N]`` as :meth:`~specmoe.interfaces.target.Target.forward` takes them) after the
    cached slots at ``kv_pos, kv_valid [B, S]`` -> ``(final hidden [B, N, H], hidden states (embeddings, each
    layer's output but the last, the final normalized state), routing [L, B * N, K], float32 logits
    [V, B, N])`` (the logits vocabulary-major: each LM-head row is read once for every token). ``row_weights``:
    :meth:`GraphDecoder._row_weights` (dense products by the row kernels), or ``None``."""
    from specmoe.interfaces.kv import tree_masks

    b, n = ids.shape
    h = embed[ids]
    masks = tree_masks(kv_pos, kv_valid, positions, attend, valid, spec.windows, None, h.dtype)
    cos, sin = cos_table[positions], sin_table[positions]  # [B, N, D]
    states = [h]
    routing = []
    for i in range(spec.layers):
        w = layers[i]
        mask = masks[spec.layer_window[i]]
        h = h + _attention(spec, _rms(h, w[0], spec.eps), w, cos, sin, kbufs[i], vbufs[i], mask,
                           None if row_weights is None else row_weights[i])
        x = _rms(h, w[12], spec.eps).flatten(0, 1)
        with RowInvariantLinear():
            _, scores, index = routers[i](x)
        routing.append(index)
        if isinstance(experts[i], int):  # the experts module's own call, opaque
            y = _experts(x, index, scores, experts[i])
        else:  # the verifier's graph form
            y = experts[i](experts_weights[i], x, index, scores)
        h = h + y.unflatten(0, (b, n))
        if i < spec.layers - 1:
            states.append(h)
    h = _rms(h, final_norm, spec.eps)
    states.append(h)
    if row_weights is not None:
        head_t, head_b = row_weights[-1]
        logits = torch.ops.specmoe.row_linear(h.float().flatten(0, 1), head_t, head_b).t().unflatten(1, (b, n))
    else:
        logits = (h.float()[None] * head.float()[:, None, None, :]).sum(-1)  # [V, B, N]
        if head_bias is not None:
            logits = logits + head_bias.float()[:, None, None]
    return h, states, torch.stack(routing), logits


def _two_rows(ids: torch.Tensor, positions: torch.Tensor, attend: torch.Tensor, valid: torch.Tensor):
    """A one-token pass as a two-token one: the token again as a second row that sees exactly what the first
    sees (the cache and the first row's slot, never its own, which the first does not see either: it lies past
    the pass's, overwritten by the next one), so it computes the first row's values bit for bit and the row
    kernels compute them once (:mod:`specmoe.kernels.row_kernels`). A compiled size of one would be a constant
    and its own variant, with loops of its own; from two tokens on, every pass (the autoregressive step
    included) runs the same generated code."""
    b = ids.shape[0]
    pair = torch.zeros(b, 2, 2, dtype=torch.bool, device=attend.device)
    pair[:, 0, 0] = attend[:, 0, 0]
    pair[:, 1, 0] = attend[:, 0, 0]
    return (torch.cat([ids, ids], dim=1), torch.cat([positions, positions], dim=1), pair,
            torch.cat([valid, valid], dim=1))


class GraphDecoder:
    """The compiled decoding pass of one target (see the module docstring).

    Args:
        lean: the target's :class:`~specmoe_plugins.targets.hf.lean.LeanDecoder` (the network it runs, and the
            prompt passes).
        routers: the router module of every layer (each returns ``(logits, scores [T, K], index [T, K])``).
        experts: the experts module of every layer.
        forms: per layer, the verifier's :class:`~specmoe.interfaces.verifier.GraphExperts`, or ``None`` (the
            module is called as it is).
        windows: per layer, its attention window (``None``: full attention).
    """

    def __init__(self, lean: Any, routers: list[torch.nn.Module], experts: list[torch.nn.Module],
                 forms: list[Any], windows: Sequence[int | None]) -> None:
        self.lean = lean
        self.routers = routers
        self.experts = experts  # kept: the registry holds them weakly
        self.forms = forms
        for module in experts:
            _EXPERTS[id(module)] = module
        self._calls = [id(module) if form is None else form.forward for module, form in zip(experts, forms)]
        a0 = lean.attention[0]
        distinct = tuple(dict.fromkeys(windows))
        self.spec = _Spec(layers=len(lean.layers), heads=a0.hq, kv_heads=a0.hkv, head_dim=a0.head_dim,
                          eps=float(lean.final_norm.eps), scaling=a0.scaling, qk_norm=a0.q_norm is not None,
                          sinks=a0.sinks is not None, attn_float=a0.float_attention, windows=distinct,
                          layer_window=tuple(distinct.index(w) for w in windows))
        self.vocab = int(lean.model.config.vocab_size)
        self._fn = compile_fn(_decode_pass)
        self._sources = self._weight_sources()
        self._read: tuple[int, list] | None = None  # (structure generation, :meth:`_weights`)
        self.row = lean.embed.weight.dtype in row_kernels.DTYPES and row_kernels.available()
        self._row_read: tuple[tuple, list] | None = None  # (the sources' stamps, :meth:`_row_weights`)
        self._hooks = self._hook_counts()
        self.state = "new"  # new -> ready (a batch size passed the trial) | off
        self.tried: set[int] = set()  # batch sizes whose compiled variant passed the first-use trial
        self.reason = ""
        self.passes = 0  # compiled passes run (the first-use trial's not counted)

    @classmethod
    def build(cls, lean: Any, graph_experts: Callable[[Any], Any] | None = None,
              windows: Sequence[int | None] = ()) -> GraphDecoder | None:
        """A compiled pass for ``lean``'s model with the verifier's ``graph_experts`` (``experts module ->
        GraphExperts | None``; absent: every experts module called as it is), or ``None`` (logged) where the
        passes stay eager: compiled
        passes switched off (``SPECMOE_COMPILE=0``), not a CPU model, a rotary embedding that is not static, an
        MLP other than a router and an experts module, attention sinks on some layers only, an LM head that is
        not a linear layer, or norms of different epsilons.
        ``windows``: per layer, its attention window (``None`` or absent: full attention)."""
        reason = None
        model = lean.model if lean is not None else None
        if lean is None:
            reason = "no lean decoder"
        elif not enabled():
            reason = "SPECMOE_COMPILE=0"
        elif lean.embed.weight.device.type != "cpu":
            reason = "compiled passes are built for CPUs"
        elif not static(lean.rotary):
            reason = "a rotary embedding whose tables change with the sequence"
        routers: list = []
        experts: list = []
        forms: list = []
        if reason is None:
            eps = {lean.final_norm.eps} | {n.eps for pair in lean.norms for n in pair}
            eps |= {n.eps for a in lean.attention for n in (a.q_norm, a.k_norm) if n is not None}
            if len(eps) != 1:
                reason = "norms with different epsilons"
            for layer in lean.layers:
                mlp = layer.mlp
                names = {name for name, _ in mlp.named_children()}
                router = getattr(mlp, "router", None) or getattr(mlp, "gate", None)
                if router is None or names - {"router", "gate", "experts"} or not hasattr(mlp, "experts"):
                    reason = f"MLP {type(mlp).__name__} is not a router and an experts module"
                    break
                routers.append(router)
                experts.append(mlp.experts)
                forms.append(graph_experts(mlp.experts) if graph_experts is not None else None)
            if reason is None and any(a.sinks is not None for a in lean.attention) != all(
                    a.sinks is not None for a in lean.attention):
                reason = "attention sinks on some layers only"
            if reason is None and not isinstance(lean.model.get_output_embeddings(), torch.nn.Linear):
                reason = "the LM head is not a linear layer"
        if reason is not None:
            logger.info("compiled decoding passes off for %s: %s", type(model).__name__, reason)
            return None
        per_layer = list(windows) + [None] * (len(lean.layers) - len(windows))
        return cls(lean, routers, experts, forms, per_layer)

    def _hook_counts(self) -> tuple:
        """How many forward (pre-)hooks the routers and experts modules have, and every module globally."""
        from torch.nn.modules import module as nn_module

        mods = (*self.routers, *self.experts)
        return (tuple(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in mods),
                len(nn_module._global_forward_hooks) + len(nn_module._global_forward_pre_hooks))

    def applies(self, kv: Any, rows: int, cached_attend: Any = None) -> bool:
        """Whether a pass of ``rows`` rows (batch x new tokens) into the KV state ``kv`` runs compiled: every
        layer's buffers exist and hold slots (not a prompt pass), at most :data:`MAX_ROWS` rows, no restriction
        on the cached slots (``cached_attend``), not switched off (here or by ``SPECMOE_COMPILE=0``), and no
        forward hook added to a router or experts module (or globally) since the pass was built: the compiled
        graph does not see hooks added after it was traced (forced routing, ``bench expert_latency``'s
        ``override_routers``, would be ignored), so such passes run eagerly, hooks and all."""
        if self.state == "off" or rows > MAX_ROWS or cached_attend is not None or not enabled():
            return False
        if self._hook_counts() != self._hooks:
            return False
        layers = getattr(kv.cache, "layers", None)
        return (layers is not None and len(layers) == self.spec.layers and kv.num_slots > 0
                and all(getattr(layer, "is_initialized", False) and getattr(layer, "length", -1) == kv.num_slots
                        and hasattr(layer, "reserve") for layer in layers))

    def _weight_sources(self) -> list:
        """``(module, attribute)`` of every tensor the pass reads, in :meth:`_weights`'s order."""
        lean = self.lean
        out = []
        for (n_in, n_post), a in zip(lean.norms, lean.attention):
            att = a.attn
            layer = [(n_in.norm, "weight")]
            for proj in (att.q_proj, att.k_proj, att.v_proj):
                layer += [(proj, "weight"), (proj, "bias")]
            layer += [(a.q_norm.norm if a.q_norm is not None else None, "weight"),
                      (a.k_norm.norm if a.k_norm is not None else None, "weight"),
                      (att.o_proj, "weight"), (att.o_proj, "bias"), (att, "sinks"), (n_post.norm, "weight")]
            out.append(layer)
        head = lean.model.get_output_embeddings()
        out.append([(lean.embed, "weight"), (lean.final_norm.norm, "weight"), (head, "weight"), (head, "bias")])
        return out

    def _weights(self) -> list:
        """Per layer ``(input norm, q weight, q bias, k weight, k bias, v weight, v bias, q norm, k norm, o weight,
        o bias, sinks, post-attention norm)``, then ``(embedding, final norm, head weight, head bias)``: the
        model's own tensors (an updated weight is used), read from their modules again after any module's
        parameters, buffers or submodules were reassigned (:func:`~specmoe.models.compiling.structure_generation`:
        a replaced weight is used too)."""
        gen = structure_generation()
        if self._read is None or self._read[0] != gen:
            self._read = (gen, [tuple(None if m is None else getattr(m, name, None) for m, name in layer)
                                for layer in self._sources])
        return self._read[1]

    def _row_weights(self, weights: list) -> list | None:
        """Input-major copies for :func:`~specmoe.kernels.row_kernels.row_linear` (``None`` where the row kernels
        are not used): per layer ``(q|k|v weight [H, (heads + 2 kv heads) * D], its bias or None, o weight
        [heads * D, H], o bias or None)``, then ``(head weight [H, V], head bias or None)``; made again when a
        source tensor changes (storage or version counter: an in-place update is seen)."""
        if not self.row:
            return None
        sources = [t for layer in weights[:-1] for t in (layer[1], layer[2], layer[3], layer[4], layer[5], layer[6],
                                                         layer[9], layer[10])] + [weights[-1][2], weights[-1][3]]
        stamp = tuple((t.data_ptr(), t._version) if t is not None else None for t in sources)
        if self._row_read is not None and self._row_read[0] == stamp:
            return self._row_read[1]

        def cat_bias(*pairs):
            if all(b is None for _, b in pairs):
                return None
            return torch.cat([b.detach() if b is not None else w.new_zeros(w.shape[0]) for w, b in pairs])

        out = []
        with torch.no_grad():
            for layer in weights[:-1]:
                q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b = (layer[j] for j in (1, 2, 3, 4, 5, 6, 9, 10))
                qkv_t = torch.cat([q_w.detach(), k_w.detach(), v_w.detach()]).t().contiguous()
                out.append((qkv_t, cat_bias((q_w, q_b), (k_w, k_b), (v_w, v_b)), o_w.detach().t().contiguous(),
                            None if o_b is None else o_b.detach().contiguous()))
            head_w, head_b = weights[-1][2], weights[-1][3]
            out.append((head_w.detach().t().contiguous(), None if head_b is None else head_b.detach().contiguous()))
        self._row_read = (stamp, out)
        return out

    def _run(self, input_ids: torch.Tensor, positions: torch.Tensor, kv: Any, attend: torch.Tensor,
             valid: torch.Tensor):
        """The compiled pass over ``N`` new tokens (a one-token pass runs as two: :func:`_two_rows`) ->
        ``(final hidden [B, N, H], hidden states, routing [B, N, L, K], float32 logits [B, N, V])``."""
        lean = self.lean
        b, n = input_ids.shape
        layers = kv.cache.layers
        start = kv.num_slots
        if n == 1:
            input_ids, positions, attend, valid = _two_rows(input_ids, positions, attend, valid)
        rows = input_ids.shape[1]
        bufs = [layer.reserve(rows) for layer in layers]
        cos, sin = lean._rope.table(lean.embed.weight, start + rows)
        weights = self._weights()
        embed, final_norm, head_w, head_b = weights[-1]
        # inputs with the strides of new tensors (a view's strides on a size-one dimension would be guarded on)
        input_ids, positions, attend, valid = (standard(t) for t in (input_ids, positions, attend, valid))
        kv_pos, kv_valid = standard(kv.pos), standard(kv.valid)
        kbufs, vbufs = [k for k, _ in bufs], [v for _, v in bufs]
        if b not in self.tried:  # the trial compiles this batch size's variant; later passes match it unmarked
            for t in (input_ids, positions, valid, kv_pos, kv_valid):
                dynamic(t, 1)
            dynamic(attend, 1, 2)
            for t in (cos, sin):
                dynamic(t, 0)
            for t in (*kbufs, *vbufs):
                dynamic(t, 2)
        h, states, routing, logits = self._fn(
            self.spec, input_ids, positions, cos, sin, kv_pos, kv_valid, attend, valid, kbufs, vbufs, embed,
            weights[:-1], self.routers, self._calls, [None if f is None else f.weights() for f in self.forms],
            final_norm, head_w, head_b, self._row_weights(weights))
        for layer in layers:
            layer.advance(n)
        routing = routing.view(self.spec.layers, b, rows, routing.shape[-1]).permute(1, 2, 0, 3)
        logits = logits.permute(1, 2, 0)
        if n == 1:  # the real row
            routing, h, logits, states = routing[:, :1], h[:, :1], logits[:, :1], [t[:, :1] for t in states]
        return h, states, routing, logits

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv: Any, attend: torch.Tensor,
                 valid: torch.Tensor):
        """One decoding pass (:meth:`applies` must hold; ``attend [B, N, N]``, ``valid [B, N]``) -> ``(final
        hidden [B, N, H], hidden states list, routing [B, N, L, K], float32 logits [B, N, V])``, or ``None``
        where the passes stay eager (compiling failed, or the trial at first use); nothing was written then."""
        if input_ids.shape[0] not in self.tried and not self._trial(input_ids, positions, kv):
            return None
        try:
            out = self._run(input_ids, positions, kv, attend, valid)
            self.passes += 1
            return out
        except Exception as exc:  # a compiler missing or failing on this machine: the eager pass stays
            self._off(failure(exc))
            return None

    def _off(self, reason: str) -> None:
        self.state, self.reason = "off", reason
        logger.warning("compiled decoding passes off for %s: %s; the eager lean path runs every pass",
                       type(self.lean.model).__name__, reason)

    def _trial(self, input_ids: torch.Tensor, positions: torch.Tensor, kv: Any) -> bool:
        """At the first pass of each batch size (a compiled variant of its own), on this machine:
        :data:`TRIAL_ROWS` new tokens (following this pass's first ones) as one
        causal pass, and then one at a time over the same cache (each seeing the slots the earlier ones wrote,
        as in the pass together), must give each token the same hidden states, routing and logits. The KV
        state is left as it was."""
        layers = kv.cache.layers
        start = kv.num_slots
        b, k = input_ids.shape[0], TRIAL_ROWS
        steps = torch.arange(k, device=input_ids.device)
        ids = (input_ids[:, :1] + steps) % self.vocab
        pos = positions[:, :1] + steps
        causal = torch.ones(k, k, dtype=torch.bool, device=ids.device).tril().expand(b, k, k)
        ones = torch.ones(b, k, dtype=torch.bool, device=ids.device)
        ok = True
        try:
            together = self._run(ids, pos, kv, causal, ones)
            for layer in layers:
                layer.truncate(start)
            for j in range(k):
                alone = self._run(ids[:, j:j + 1], pos[:, j:j + 1], kv, causal[:, j:j + 1, j:j + 1],
                                  ones[:, j:j + 1])
                kv.append(pos[:, j:j + 1], ones[:, j:j + 1])  # the slot this row wrote, as the engine records it
                for whole, part in zip((together[0], together[2], together[3], *together[1]),
                                       (alone[0], alone[2], alone[3], *alone[1])):
                    ok = ok and torch.equal(whole[:, j:j + 1], part)
        except Exception as exc:  # a compiler missing or failing on this machine
            self._off(failure(exc))
            return False
        finally:
            kv.drop_last(kv.num_slots - start)
            for layer in layers:
                layer.truncate(start)
        if not ok:
            self._off("a row of a multi-row pass differs from the same row alone on this machine")
            return False
        self.state = "ready"
        self.tried.add(b)
        return True

