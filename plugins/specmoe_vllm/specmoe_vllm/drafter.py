# SPDX-License-Identifier: Apache-2.0
"""Plain steps under speculation: no drafter pass, no rejection sampler, where a step proposes and verifies nothing.

vLLM 0.32's V1 model runner (GPU and CPU) runs the EAGLE drafter after every target pass once speculation is
configured, also when the step's proposal length (``num_spec_tokens_to_schedule``) is 0: its first pass writes the
draft's KV cache for the step's tokens (``SpecDecodeBaseProposer.propose``, "The prefill forward pass above already
ran to keep the drafter KV cache in sync"), and every step samples through the rejection sampler, drafts or not
(``GPUModelRunner._prepare_inputs`` builds speculative metadata whenever ``speculative_config`` is set). So a step
where specmoe's policy turns speculation off costs more than plain decoding (measured on the demo: 4.04 vs 2.77 ms
per token, README of the plugin).

:class:`HoldingProposer` (a subclass of vLLM's ``EagleProposer``, put in place of it by :func:`install`, which the
plugin's ``vllm.general_plugins`` entry point calls) removes both costs while the draft's KV stays what vLLM would
have written:

* a step whose proposal length is 0 does not run the drafter: it *holds* the rows the first pass would have
  consumed (per request its verified tokens: input token, position, the target's hidden states, KV slot);
* the next step that runs the drafter prepends each request's held rows to its own (they are contiguous positions
  of the same request, so the first pass's one-token shift pairs them exactly as the skipped passes would have):
  one pass writes the draft KV of the held positions and of the step, then drafts as usual;
* a step in which no request holds a draft takes vLLM's plain sampler (``spec_decode_metadata`` None), as without
  speculation.

The scheduler says per step whether to hold (``SchedulerOutput.specmoe_hold``, the policy's
:meth:`~specmoe_vllm.policy.GoodputPolicy.holds`): where the policy's next probe is further away than every
request of the step can still decode, no step would read the rows; the step then holds nothing, drops what is
held (``unheld_steps``) and runs entirely as vLLM's steps without speculation (:func:`_wrap_plain_steps`).

Lossless by construction: the target's verification decides every committed token; the drafter only proposes.
Held rows that cannot be replayed (the request was recomputed after preemption, or the catch-up would not fit the
drafter's token buffer, or a verifying step would need them) are dropped and counted (``dropped_rows``): the draft
then reads stale KV at those positions, which can lower acceptance, never change the output.

Enabled with the plugin's options (``additional_config["specmoe"]``, ``skip_drafter``, default true) for the
default EAGLE pathway only: method ``eagle`` / ``eagle3`` / ``mtp``, text-only, no M-RoPE, no parallel drafting,
padded drafter batch, data parallel size 1 (other ranks would wait on the drafter's collectives), no recurrent
(hybrid) layers. Anything else keeps vLLM's own behaviour. Tested with vLLM 0.32 (V1 model runner); the V2 model
runner (vLLM's GPU default where it applies) is not hooked.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
from typing import Any

__all__ = ["install", "skipping_wanted", "RUNNER_MODULE"]

RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
_log = logging.getLogger("specmoe_vllm")


def skipping_wanted(vllm_config: Any) -> tuple[bool, str]:
    """Whether the plugin is configured with ``skip_drafter`` on, and the configuration allows it (why not)."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    opts = extra.get("specmoe") if isinstance(extra, dict) else None
    if not isinstance(opts, dict) or not opts.get("skip_drafter", True):
        return False, "off"
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or spec.method not in ("eagle", "eagle3", "mtp"):
        return False, f"method {getattr(spec, 'method', None)!r} (eagle, eagle3, mtp only)"
    if getattr(spec, "parallel_drafting", False) or getattr(spec, "disable_padded_drafter_batch", False):
        return False, "parallel drafting / unpadded drafter batch"
    if vllm_config.parallel_config.data_parallel_size > 1:
        return False, "data parallel > 1"
    mc = vllm_config.model_config
    for flag in ("is_hybrid", "has_inner_state", "uses_mrope", "supports_multimodal_inputs"):
        if getattr(mc, flag, False):
            return False, f"the target's model_config.{flag}"
    return True, "on"


def _ints(t: Any, n: int, views: dict[int, tuple[Any, Any]] | None = None) -> list[int]:
    """The first ``n`` entries of an integer tensor as Python ints: a host tensor through its numpy view (inside
    vLLM's step, where the model's pass leaves the caches cold, a torch slice costs several microseconds), the view
    kept in ``views`` for vLLM's persistent buffers (the same tensor every step)."""
    if t.device.type != "cpu":
        return t[:n].tolist()
    if views is None:
        return t.numpy()[:n].tolist()
    hit = views.get(id(t))
    if hit is None or hit[0] is not t:
        hit = views[id(t)] = (t, t.numpy())
    return hit[1][:n].tolist()


class _Held:
    """Per request, the rows the skipped first passes would have consumed, in position order.

    Tokens, positions and KV slots are kept as Python ints, the hidden states in one arena of ``capacity`` rows
    allocated at the first hold: a held step costs one copy (the aux hidden states concatenated into the arena),
    not four clones (a floor step's host work: ~0.1 ms inside vLLM before). Rows of a request that was replayed,
    dropped or finished are reclaimed when no request holds rows any more, or by compacting the live rows to the
    front when the arena is full (so a server whose requests overlap forever does not grow it)."""

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = max(0, int(capacity))
        self.hidden: Any = None  # [capacity, H]
        self.tok: list[int] = []  # per arena row
        self.pos: list[int] = []
        self.slot: list[int] = []
        self.rows: dict[str, list[tuple[int, int]]] = {}  # req -> [(start, count)] in the arena, position order
        self.last: dict[str, int] = {}  # req -> last held position
        self.total = 0  # live rows
        self.dropped = 0

    @property
    def used(self) -> int:
        """Arena rows written since it was last empty or compacted."""
        return len(self.tok)

    def _reset(self) -> None:
        self.tok, self.pos, self.slot = [], [], []
        self.total = 0

    def drop(self, req: str, lost: bool = True) -> None:
        """Forget a request's rows; ``lost``: they were not replayed (its draft KV there stays stale)."""
        n = sum(c for _, c in self.rows.pop(req, ()))
        self.last.pop(req, None)
        self.total -= n
        self.dropped += n if lost else 0
        if not self.rows:
            self._reset()

    def room(self, n: int) -> bool:
        """Whether ``n`` more rows fit (the live rows compacted first where that makes the room)."""
        if self.used + n <= self.capacity:
            return True
        if self.total + n > self.capacity:
            return False
        self._compact()
        return True

    def _compact(self) -> None:
        import torch

        order = list(self.rows.items())
        idx = [i for _, segs in order for s, c in segs for i in range(s, s + c)]
        if self.hidden is not None and idx:
            self.hidden[: len(idx)] = self.hidden.index_select(0, torch.tensor(idx, device=self.hidden.device))
        self.tok, self.pos, self.slot = ([v[i] for i in idx] for v in (self.tok, self.pos, self.slot))
        off = 0
        for r, segs in order:
            n = sum(c for _, c in segs)
            self.rows[r] = [(off, n)]
            off += n

    def put(self, tok: list[int], pos: list[int], slot: list[int], hidden: Any, ix: Any = None) -> int:
        """Append the rows (``hidden``: a tensor, rows ``ix`` of it where given, or a list of parts to
        concatenate along the last dimension); their arena start. The caller checked :meth:`room`."""
        import torch

        parts = isinstance(hidden, (list, tuple))
        if self.hidden is None:
            width = sum(h.shape[-1] for h in hidden) if parts else hidden.shape[-1]
            first = hidden[0] if parts else hidden
            self.hidden = torch.empty(self.capacity, width, dtype=first.dtype, device=first.device)
        u, n = self.used, len(tok)
        dst = self.hidden[u: u + n]
        if ix is not None:
            torch.index_select(hidden, 0, ix, out=dst)
        elif parts:
            torch.cat([h[:n] for h in hidden], dim=-1, out=dst)
        else:
            dst.copy_(hidden[:n])
        self.tok += tok
        self.pos += pos
        self.slot += slot
        return u


def _make_class(base: type) -> type:
    import numpy as np
    import torch

    class HoldingProposer(base):  # type: ignore[misc, valid-type]
        """vLLM's EAGLE proposer that holds the rows of steps proposing nothing (module docstring)."""

        def __init__(self, vllm_config: Any, device: Any, runner: Any = None, *args: Any, **kwargs: Any):
            super().__init__(vllm_config, device, runner, *args, **kwargs)
            on, why = skipping_wanted(vllm_config)
            self.specmoe_skip = bool(on and runner is not None and not self.needs_extra_input_slots)
            self.specmoe_held = _Held(self.max_num_tokens // 2)
            self._specmoe_views: dict[int, tuple[Any, Any]] = {}  # numpy views of vLLM's host buffers
            self.specmoe_stats = {"skipped_steps": 0, "catch_up_rows": 0, "plain_steps": 0, "unheld_steps": 0,
                                  "aux_off_steps": 0}
            self._specmoe_runner = runner
            if self.specmoe_skip:
                _wrap_prepare_inputs(runner, self.specmoe_stats)
                _wrap_propose(runner, self)
                _wrap_plain_steps(runner, self)
            elif why != "off":
                _log.warning("specmoe_vllm: skip_drafter is off here: %s", why)

        def propose(self, num_speculative_tokens: int, target_token_ids: Any, target_positions: Any,
                    target_hidden_states: Any, next_token_ids: Any, token_indices_to_sample: Any,
                    common_attn_metadata: Any, sampling_metadata: Any, mm_embed_inputs: Any = None,
                    num_rejected_tokens_gpu: Any = None, slot_mappings: Any = None) -> Any:
            if num_speculative_tokens != 0 and not self.specmoe_held.rows:
                # drafts to make and nothing held (every speculative step but a catch-up): vLLM's way as it is,
                # without reading the step's requests (what the path below would conclude)
                return super().propose(num_speculative_tokens, target_token_ids, target_positions,
                                       target_hidden_states, next_token_ids, token_indices_to_sample,
                                       common_attn_metadata, sampling_metadata, mm_embed_inputs=mm_embed_inputs,
                                       num_rejected_tokens_gpu=num_rejected_tokens_gpu, slot_mappings=slot_mappings)
            kw = dict(num_speculative_tokens=num_speculative_tokens, target_token_ids=target_token_ids,
                      target_positions=target_positions, target_hidden_states=target_hidden_states,
                      next_token_ids=next_token_ids, token_indices_to_sample=token_indices_to_sample,
                      common_attn_metadata=common_attn_metadata, sampling_metadata=sampling_metadata,
                      mm_embed_inputs=mm_embed_inputs, num_rejected_tokens_gpu=num_rejected_tokens_gpu,
                      slot_mappings=slot_mappings)
            cad = common_attn_metadata
            # off, multimodal inputs, or padded rows (CUDA graphs): vLLM's own way
            if not self._specmoe_active(cad) or mm_embed_inputs is not None:
                return super().propose(**kw)
            req_ids, qsl, held_now = self._specmoe_try_hold(num_speculative_tokens, target_token_ids,
                                                             target_positions, target_hidden_states,
                                                             token_indices_to_sample, cad)
            if held_now:
                return torch.empty(len(req_ids), 0, device=target_token_ids.device, dtype=torch.int64)
            held = self.specmoe_held
            pending = [r for r in req_ids if r in held.rows]
            if pending:
                verifying = token_indices_to_sample is not None or num_rejected_tokens_gpu is not None
                n_held = sum(c for r in pending for _, c in held.rows[r])
                if verifying or n_held + qsl[-1] > self.max_num_tokens:
                    for r in pending:
                        held.drop(r)
                else:
                    (kw["target_token_ids"], kw["target_positions"], kw["target_hidden_states"],
                     kw["common_attn_metadata"]) = self._merge(req_ids, qsl, target_token_ids, target_positions,
                                                               target_hidden_states, cad)
            return super().propose(**kw)

        # ---------------------------------------------------------------- the held rows
        def _specmoe_active(self, cad: Any) -> bool:
            return self.specmoe_skip and cad.batch_size() == self._specmoe_runner.input_batch.num_reqs

        def _specmoe_try_hold(self, num_speculative_tokens: int, tokens: Any, positions: Any, hidden: Any,
                              token_indices_to_sample: Any, cad: Any, qsl_buf: Any = None
                              ) -> tuple[list[str], list[int], bool]:
            """The step's requests and query starts; and whether the step proposes nothing and its rows were
            held (``hidden``: a tensor, or the aux parts to concatenate; ``qsl_buf``: vLLM's persistent buffer
            whose head ``cad``'s query starts are, where the caller knows they are)."""
            held = self.specmoe_held
            self._forget_finished()
            b = cad.batch_size()
            runner = self._specmoe_runner
            req_ids = list(runner.input_batch.req_ids[:b])
            qsl = (_ints(qsl_buf, b + 1, self._specmoe_views) if qsl_buf is not None
                   else _ints(cad.query_start_loc_cpu, b + 1))
            if not held.rows and num_speculative_tokens != 0:
                return req_ids, qsl, False  # nothing held, nothing to hold: vLLM's way as it is
            # per request its last verified row (the rest of a verifying step's rows were rejected)
            ends = (token_indices_to_sample.tolist() if token_indices_to_sample is not None
                    else [e - 1 for e in qsl[1:]])
            pos = _ints(positions, qsl[-1], self._specmoe_views if qsl_buf is not None else None)
            for r, s in zip(req_ids, qsl):  # recomputed (preempted) or otherwise not contiguous: cannot replay
                if r in held.rows and held.last[r] + 1 != pos[s]:
                    held.drop(r)
            keep = sum(e - s + 1 for s, e in zip(qsl, ends))
            if num_speculative_tokens != 0 or not held.room(keep):
                return req_ids, qsl, False
            self._hold(req_ids, qsl, ends, pos, tokens, hidden, cad.slot_mapping,
                       self._specmoe_views if qsl_buf is not None else None)
            self.specmoe_stats["skipped_steps"] += 1
            return req_ids, qsl, True

        def specmoe_skip_step(self, scheduler_output: Any, hidden_states: Any, aux_hidden_states: Any,
                              cad: Any) -> Any:
            """The runner's side (:func:`_wrap_propose`): a step that verified nothing and proposes nothing is
            held before vLLM prepares the drafter's inputs; None where it cannot be (vLLM's way then). (A step
            whose rows no later step reads does not come here: :func:`_wrap_plain_steps`.)"""
            runner = self._specmoe_runner
            if not self._specmoe_active(cad):
                return None
            hidden = list(aux_hidden_states) if runner.use_aux_hidden_state_outputs else hidden_states
            # vLLM's persistent buffers (the same tensors every step, whose numpy views are kept): its positions
            # (M-RoPE, their other form, is not enabled here) and the query starts cad's are the head of
            positions = getattr(runner, "positions", None)
            qsl_buf = getattr(getattr(runner, "query_start_loc", None), "cpu", None)
            if not isinstance(positions, torch.Tensor) or positions.dim() != 1 or qsl_buf is None:
                positions, qsl_buf = runner._get_positions(cad.num_actual_tokens), None
            req_ids, _, held = self._specmoe_try_hold(0, runner.input_ids.gpu, positions, hidden, None, cad,
                                                      qsl_buf)
            # no drafts as vLLM's token-id proposers give them (a list per request): the runner then skips the
            # copy of an empty draft tensor to the host and its event (only the asynchronous scheduling this
            # path excludes reads the tensor form)
            return [[] for _ in req_ids] if held else None

        def specmoe_unhold(self) -> None:
            """A step whose rows no later step reads (:func:`_wrap_plain_steps`): what is held is dropped too."""
            held = self.specmoe_held
            for r in list(held.rows):
                held.drop(r, lost=False)
            self.specmoe_stats["unheld_steps"] += 1

        def _forget_finished(self) -> None:
            held = self.specmoe_held
            live = self._specmoe_runner.requests
            for r in [r for r in held.rows if r not in live]:
                held.drop(r, lost=False)  # finished: nobody drafts from its rows again

        def _hold(self, req_ids: list[str], qsl: list[int], ends: list[int], pos: list[int], tokens: Any,
                  hidden: Any, slots: Any, views: dict[int, tuple[Any, Any]] | None = None) -> None:
            """Hold the step's kept rows (``views``: where ``tokens`` is vLLM's persistent buffer)."""
            held = self.specmoe_held
            n_all = qsl[-1]
            tok, slot = _ints(tokens, n_all, views), _ints(slots, n_all)
            ix = None  # every row of the step kept (a step that verified nothing): plain copies
            if any(e + 1 != s for s, e in zip(qsl[1:], ends)):
                idx = [i for s, e in zip(qsl[:-1], ends) for i in range(s, e + 1)]
                tok, pos, slot = ([v[i] for i in idx] for v in (tok, pos, slot))
                ix = torch.tensor(idx, device=tokens.device)
                if isinstance(hidden, list):
                    hidden = torch.cat([h[:n_all] for h in hidden], dim=-1)
            off = held.put(tok, pos, slot, hidden, ix)
            for r, s, e in zip(req_ids, qsl[:-1], ends):
                n = e - s + 1
                segs = held.rows.setdefault(r, [])
                if segs and segs[-1][0] + segs[-1][1] == off:
                    segs[-1] = (segs[-1][0], segs[-1][1] + n)  # contiguous with its last rows: one segment
                else:
                    segs.append((off, n))
                held.last[r] = held.pos[off + n - 1]
                off += n
                held.total += n

        def _merge(self, req_ids: list[str], qsl: list[int], tokens: Any, positions: Any, hidden: Any,
                   cad: Any) -> tuple[Any, Any, Any, Any]:
            """The step's rows with each request's held rows in front; its attention metadata to match."""
            held = self.specmoe_held
            cur = held.used
            index, lens = [], []
            for i, r in enumerate(req_ids):
                parts = [np.arange(o, o + n) for o, n in held.rows.get(r, ())]
                parts.append(np.arange(cur + qsl[i], cur + qsl[i + 1]))
                seg = np.concatenate(parts)
                index.append(seg)
                lens.append(len(seg))
            caught = sum(lens) - qsl[-1]
            dev = tokens.device
            n = qsl[-1]
            ix = torch.from_numpy(np.concatenate(index)).to(dev)

            def cat(kept: Any, cur_t: Any) -> Any:
                if isinstance(kept, list):  # held ints
                    kept = torch.tensor(kept, dtype=cur_t.dtype, device=dev)
                    return torch.cat([kept, cur_t[:n]]).index_select(0, ix)
                return torch.cat([kept[:cur], cur_t[:n].to(kept.dtype)]).index_select(0, ix)

            new_tokens, new_pos = cat(held.tok, tokens), cat(held.pos, positions)
            new_hidden, new_slots = cat(held.hidden, hidden), cat(held.slot, cad.slot_mapping)
            new_qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
            qsl_cpu = torch.from_numpy(new_qsl)
            new_cad = cad.replace(query_start_loc=qsl_cpu.to(dev), query_start_loc_cpu=qsl_cpu,
                                  num_actual_tokens=int(new_qsl[-1]), max_query_len=int(max(lens)),
                                  slot_mapping=new_slots,
                                  positions=new_pos if cad.positions is not None else None,
                                  _num_computed_tokens_cache=None, _token_to_req_indices_cache=None)
            for r in req_ids:
                if r in held.rows:
                    held.total -= sum(c for _, c in held.rows.pop(r))
                    held.last.pop(r, None)
            if not held.rows:
                held._reset()
            self.specmoe_stats["catch_up_rows"] += caught
            return new_tokens, new_pos, new_hidden, new_cad

    HoldingProposer.__name__ = HoldingProposer.__qualname__ = "HoldingProposer"
    return HoldingProposer


def _wrap_prepare_inputs(runner: Any, stats: dict[str, int]) -> None:
    """A step in which no request holds a draft prepares its inputs as without speculation: plain logits
    indices, no speculative metadata, so vLLM's plain sampler samples it (the only use of
    ``speculative_config`` in ``GPUModelRunner._prepare_inputs`` is that choice)."""
    original = runner._prepare_inputs

    def _prepare_inputs(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if any(scheduler_output.scheduled_spec_decode_tokens.values()):
            return original(scheduler_output, *args, **kwargs)
        stats["plain_steps"] += 1
        spec, runner.speculative_config = runner.speculative_config, None
        try:
            return original(scheduler_output, *args, **kwargs)
        finally:
            runner.speculative_config = spec

    runner._prepare_inputs = _prepare_inputs


def _aux_holder(runner: Any) -> Any:
    """The module that captures the target's auxiliary hidden states for EAGLE-3 (``aux_hidden_state_layers``,
    found as vLLM's ``set_aux_hidden_state_layers`` finds it), or None."""
    try:
        model = runner.get_model()
    except Exception:  # noqa: BLE001 - no model: nothing to switch off
        return None
    parent = model.get_language_model() if hasattr(model, "get_language_model") else \
        getattr(model, "language_model", model)
    holder = getattr(parent, "model", parent)
    # a plain instance attribute (what restore() writes back through __dict__)
    return holder if isinstance(holder.__dict__.get("aux_hidden_state_layers"), tuple) else None


def _wrap_plain_steps(runner: Any, drafter: Any) -> None:
    """A step that verifies nothing, proposes nothing and holds nothing (``SchedulerOutput.specmoe_hold`` false)
    runs as vLLM runs without speculation: ``speculative_config`` is put aside from its ``execute_model`` to the
    end of its ``sample_tokens``, so vLLM builds no drafter metadata, clamps no draft placeholders, skips the
    drafter branch and leaves no draft ids for the engine to hand back (at batch 1, T = 1 on a Zen 4, measured
    in-process: a floor step +0.34 ms over no speculation outside the target's forward before, +0.18 ms after);
    and the target's forward captures no auxiliary hidden states for EAGLE-3 (no drafter pass reads them: one
    tensor addition per captured layer, ~15 us a step at batch 1). Not with asynchronous scheduling (its
    bookkeeping rides on the drafter's inputs)."""
    execute, sample = runner.execute_model, runner.sample_tokens
    aside: list[tuple[Any, bool, Any, Any]] = []  # put aside for the step in flight: config, aux flag, holder, layers
    holders: list[Any] = []  # found at the first plain step (the model is loaded by then)

    def restore() -> None:
        if aside:
            runner.speculative_config, runner.use_aux_hidden_state_outputs, holder, layers = aside.pop()
            if holder is not None:
                holder.__dict__["aux_hidden_state_layers"] = layers

    def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        restore()  # a step that ended in execute_model without a sample_tokens call (nothing to sample)
        if (getattr(scheduler_output, "specmoe_hold", True) or runner.use_async_scheduling
                or scheduler_output.num_spec_tokens_to_schedule != 0
                or any(scheduler_output.scheduled_spec_decode_tokens.values())):
            return execute(scheduler_output, *args, **kwargs)
        drafter.specmoe_unhold()
        if not holders:
            holders.append(_aux_holder(runner))
        aux = bool(getattr(runner, "use_aux_hidden_state_outputs", False))
        holder = holders[0] if aux else None
        aside.append((runner.speculative_config, aux, holder,
                      holder.aux_hidden_state_layers if holder is not None else None))
        runner.speculative_config = None
        if holder is not None:
            runner.use_aux_hidden_state_outputs = False
            # a plain attribute of the module (vLLM sets a tuple): written past nn.Module.__setattr__, whose
            # parameter / buffer / submodule checks cost ~12 us a write under cProfile here (b1 T = 1, Zen 4)
            holder.__dict__["aux_hidden_state_layers"] = ()
            drafter.specmoe_stats["aux_off_steps"] += 1
        try:
            out = execute(scheduler_output, *args, **kwargs)
        except BaseException:
            restore()
            raise
        if out is not None:  # the step's output came from execute_model: no sample_tokens follows
            restore()
        return out

    def sample_tokens(*args: Any, **kwargs: Any) -> Any:
        try:
            return sample(*args, **kwargs)
        finally:
            restore()

    runner.execute_model, runner.sample_tokens = execute_model, sample_tokens


def _wrap_propose(runner: Any, drafter: Any) -> None:
    """A step that verified nothing and proposes nothing holds its rows before vLLM prepares the drafter's
    inputs (the next tokens, the copies for asynchronous scheduling): without asynchronous scheduling, whose
    bookkeeping rides on that preparation, and for targets that feed the drafter their own hidden states."""
    original = runner.propose_draft_token_ids
    direct: list[bool] = []  # decided at the first step (the model and the async copies exist by then)

    def propose_draft_token_ids(scheduler_output: Any, sampled_token_ids: Any, sampling_metadata: Any,
                                hidden_states: Any, sample_hidden_states: Any, aux_hidden_states: Any,
                                spec_decode_metadata: Any, common_attn_metadata: Any, slot_mappings: Any) -> Any:
        if not direct:
            direct.append(getattr(runner, "valid_sampled_token_count_event", None) is None
                          and not hasattr(runner.get_model(), "get_mtp_target_hidden_states"))
        if direct[0] and scheduler_output.num_spec_tokens_to_schedule == 0 and spec_decode_metadata is None:
            out = drafter.specmoe_skip_step(scheduler_output, hidden_states, aux_hidden_states,
                                            common_attn_metadata)
            if out is not None:
                return out
        return original(scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                        sample_hidden_states, aux_hidden_states, spec_decode_metadata, common_attn_metadata,
                        slot_mappings)

    runner.propose_draft_token_ids = propose_draft_token_ids


def _patch(module: Any) -> None:
    base = getattr(module, "EagleProposer", None)
    if base is None or getattr(base, "__name__", "") == "HoldingProposer":
        return
    module.EagleProposer = _make_class(base)


class _PatchOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Patches the runner module right after it executes (wherever vLLM first imports it)."""

    def __init__(self) -> None:
        self._spec: Any = None

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != RUNNER_MODULE or self._spec is not None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._spec = spec
        self._inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        _patch(module)
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def install() -> None:
    """Put :class:`HoldingProposer` in place of the runner's ``EagleProposer`` (now, or when it is imported). It
    acts only where :func:`skipping_wanted`; otherwise it is vLLM's proposer."""
    mod = sys.modules.get(RUNNER_MODULE)
    if mod is not None:
        _patch(mod)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
