# SPDX-License-Identifier: Apache-2.0
"""vLLM's V1 scheduler with specmoe's verification budget: it only *truncates* the draft tokens a request holds.

Use it with vLLM's ``scheduler_cls`` and speculative decoding (EAGLE-3 or any proposer), the policy named in the
``additional_config`` (or ``$SPECMOE_VLLM_POLICY``)::

    LLM(model=TARGET, speculative_config={"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 5},
        scheduler_cls="specmoe_vllm.scheduler.SpecMoEScheduler",
        additional_config={"specmoe": {"policy": "policy.json"}})
    vllm serve TARGET --speculative-config '{...}' --scheduler-cls specmoe_vllm.scheduler.SpecMoEScheduler \
        --additional-config '{"specmoe": {"policy": "policy.json"}}'

``additional_config["specmoe"]`` keys: ``policy`` (the policy file, required), ``expert_cost`` (default true;
false = the token-only variant), ``online`` (refit the cost from measured step times, default true), ``clock``
(``wall``, default, or ``process``: steps timed by the engine process's CPU time, load-independent on a shared
machine with one OpenMP thread and the engine in-process), ``log`` (a JSON-lines file, flushed whenever no
request is left: per step the drafts each request held, the policy's choice, what vLLM scheduled and
``k_next``; a run of quiet steps, where no request held a draft and none were proposed, as one line
``{"step": first, "quiet_steps": n}``), ``skip_drafter`` (default true: a step that verifies and proposes
nothing runs as plain decoding, without the drafter's pass or the rejection sampler, :mod:`specmoe_vllm.drafter`;
false: vLLM's own way, every step pays them).

Each step, before vLLM's own scheduling: the policy sees every running request (its proposed drafts, last token,
context) and returns ``k_r``; a request's ``spec_token_ids`` are cut to ``k_r`` (vLLM then schedules ``1 + k_r``
tokens for it: the rejection sampler verifies exactly those, so the output is vLLM's, token for token at T = 0
and in distribution at T > 0). After it, ``num_spec_tokens_to_schedule`` (how many drafts vLLM's proposer makes
for the next step, the hook vLLM's dynamic SD uses) is set to the policy's ``k_next``: 0 turns the draft passes
off. The accepted drafts per request (from the sampled tokens) calibrate the policy's acceptance online.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from specmoe_vllm.drafter import skipping_wanted
from specmoe_vllm.policy import GoodputPolicy, PolicyFileError, Row, load_policy
from specmoe_vllm.steplog import StepLine

__all__ = ["SpecMoEScheduler", "options_from", "OPTIONS", "UNPRICED_MAX"]

#: consecutive floor steps left unpriced before one is priced (:meth:`SpecMoEScheduler._unpriced_floor_step`)
UNPRICED_MAX = 7
#: the keys of ``additional_config["specmoe"]``
OPTIONS = ("policy", "expert_cost", "online", "log", "clock", "skip_drafter")


def options_from(vllm_config: Any) -> dict[str, Any]:
    """The plugin's options: ``additional_config["specmoe"]``, else ``$SPECMOE_VLLM_POLICY`` alone."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    opts = dict(extra.get("specmoe") or {}) if isinstance(extra, dict) else {}
    if "policy" not in opts and os.environ.get("SPECMOE_VLLM_POLICY"):
        opts["policy"] = os.environ["SPECMOE_VLLM_POLICY"]
    unknown = sorted(set(opts) - set(OPTIONS))
    if unknown:
        raise PolicyFileError(f"additional_config['specmoe']: unknown key '{unknown[0]}' (known: "
                              f"{', '.join(OPTIONS)})")
    if opts.get("clock", "wall") not in ("wall", "process"):
        raise PolicyFileError(f"additional_config['specmoe']['clock'] is {opts['clock']!r}: give 'wall' or "
                              f"'process'")
    if not opts.get("policy"):
        raise PolicyFileError("specmoe_vllm needs a policy file: pass additional_config={'specmoe': {'policy': "
                              "'policy.json'}} (or set SPECMOE_VLLM_POLICY); write one with platform peer "
                              "export-policy")
    return opts


def _sampled(req: Any) -> bool:
    """A request sampled at T > 0 (its drafts are accepted at the sampled rates)."""
    return bool(req.sampling_params is not None and req.sampling_params.temperature > 0)


class SpecMoEScheduler(Scheduler):
    """vLLM's scheduler; each step's draft tokens per request capped by :class:`GoodputPolicy`."""

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any):
        super().__init__(vllm_config, *args, **kwargs)
        opts = options_from(vllm_config)
        spec = load_policy(opts["policy"])
        plain, _ = skipping_wanted(vllm_config)
        self.specmoe_policy = GoodputPolicy(spec, self.num_spec_tokens, expert_cost=bool(opts.get("expert_cost",
                                                                                                   True)),
                                            online=bool(opts.get("online", True)), plain_steps=plain)
        self._log = open(opts["log"], "a") if opts.get("log") else None
        self._line = StepLine()
        self._clock = time.process_time if opts.get("clock") == "process" else time.perf_counter
        self._pending: dict[str, Any] | None = None  # the last step's decision, until its time is known
        self._quiet: list[int] | None = None  # the open run of quiet steps in the log: [first step, steps]
        self._step = 0
        self._idle: frozenset[str] | None = None  # the requests of the last step, where it was an unheld floor step
        self._unpriced = 0  # consecutive floor steps not priced (_unpriced_floor_step)
        self.specmoe_unpriced_steps = 0  # all of them

    # -------------------------------------------------------------- before vLLM schedules
    def _rows(self) -> list[Row]:
        rows = []
        for req in self.running:
            new = req.num_tokens - req.num_computed_tokens
            if new == 1:
                rows.append(Row(req.request_id, list(req.spec_token_ids), int(req.all_token_ids[-1]),
                                req.num_computed_tokens, _sampled(req)))
            elif new > 1:
                rows.append(Row(req.request_id, [], None, req.num_computed_tokens, _sampled(req), extra_tokens=new))
        for req in self.waiting:  # its kind too: the next step's plan (K_next) is made for it
            rows.append(Row(req.request_id, [], None, 0, _sampled(req), extra_tokens=req.num_tokens))
        return rows

    def schedule(self, *args: Any, **kwargs: Any):
        # the clock only where a step's time is read or starts (CPU time costs ~15 us a call inside vLLM, whose
        # threads the kernel sums): not on the floor steps left unpriced
        now = self._clock() if self._pending is not None else None
        if self._pending is not None:  # the previous step's time: schedule -> execute -> drafts -> here
            p, self._pending = self._pending, None
            seconds = now - p["t"]
            # a request that arrived in between means the engine waited on its caller: not a step's time
            arrived = any(r.request_id not in p["ids"] for r in self.running) or len(self.waiting) > 0
            if p["pure_decode"] and not arrived and seconds < 4 * p["predicted"]:
                self.specmoe_policy.observe_time(p["shape"], seconds)
        if self.num_spec_tokens <= 0:
            return super().schedule(*args, **kwargs)
        if self._unpriced_floor_step():
            out = super().schedule(*args, **kwargs)
            out.num_spec_tokens_to_schedule = 0
            out.specmoe_hold = False
            if self._log is not None:
                self._quiet = self._quiet or [self._step, 0]
                self._quiet[1] += 1
            self._step += 1
            return out
        self._idle = None
        if now is None:
            now = self._clock()
        rows = self._rows()
        decision = self.specmoe_policy.decide(rows) if rows else None
        held = {}
        if decision is not None:
            by_id = {r.request_id: r for r in self.running}
            for row in rows:
                req = by_id.get(row.req)
                if req is None or not req.spec_token_ids:
                    continue
                held[row.req] = len(req.spec_token_ids)
                k = decision.k[row.req]
                if k < len(req.spec_token_ids):
                    req.spec_token_ids = list(req.spec_token_ids[:k])
        out = super().schedule(*args, **kwargs)
        if decision is not None:
            out.num_spec_tokens_to_schedule = decision.k_next
            # read by specmoe_vllm.drafter on a step that verifies and proposes nothing (an attribute of the
            # instance: it travels with the output, in the same process or pickled)
            out.specmoe_hold = self.specmoe_policy.holds(r.max_tokens - r.num_output_tokens for r in self.running)
            idle = not out.specmoe_hold and not held and decision.k_next == 0 and not any(decision.k.values())
            self._idle = frozenset(r.req for r in rows) if idle else None
            predicted = decision.seconds or self.specmoe_policy.cost.current.seconds(decision.shape, True)
            self._pending = {"t": now, "shape": decision.shape, "predicted": max(predicted, 1e-6),
                             "pure_decode": all(r.extra_tokens == 0 for r in rows),
                             "ids": {r.req for r in rows}}
            if self._log is not None:
                if not held and decision.k_next == 0:  # quiet: one line per run of them (a line costs ~30 us)
                    self._quiet = self._quiet or [self._step, 0]
                    self._quiet[1] += 1
                else:
                    self._write_quiet()
                    sched = {r: len(t) for r, t in out.scheduled_spec_decode_tokens.items()}
                    self._log.write(self._line.line(self._step, held, decision.k, sched, decision.k_next,
                                                    decision.rate, decision.ar_rate))
        self._step += 1
        return out

    def _unpriced_floor_step(self) -> bool:
        """Whether this step is a floor step the policy need not price: the same requests as the last step, which
        was a floor step holding no rows (no probe before they finish, :meth:`GoodputPolicy.holds`), none with a
        draft or a prompt to compute, no request waiting, the policy between probes
        (:meth:`GoodputPolicy.floor_step_unpriced` counts it). It skips the rows, the decision and the timing of
        the step (~0.04 ms of host work a step at batch 1, T = 1 on a Zen 4); one step in ``UNPRICED_MAX + 1`` is
        priced and timed all the same, so the online cost keeps seeing the floor's steps. The same choice as
        :meth:`decide` would make: nothing verified, nothing proposed, nothing held."""
        idle = self._idle
        ok = (idle is not None and not self.waiting and len(self.running) == len(idle)
              and self._unpriced < UNPRICED_MAX
              and all(not r.spec_token_ids and r.request_id in idle and r.num_tokens - r.num_computed_tokens == 1
                      for r in self.running)
              and self.specmoe_policy.floor_step_unpriced())
        self._unpriced = self._unpriced + 1 if ok else 0
        self.specmoe_unpriced_steps += ok
        return ok

    def _write_quiet(self) -> None:
        """The run of quiet steps (no request held a draft, none proposed next) as one line."""
        if self._quiet and self._log is not None:
            self._log.write(json.dumps({"step": self._quiet[0], "quiet_steps": self._quiet[1]}) + "\n")
        self._quiet = None

    # -------------------------------------------------------------- after the pass
    def update_from_output(self, scheduler_output: Any, model_runner_output: Any):
        results = []
        sampled_ids = model_runner_output.sampled_token_ids
        for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
            idx = model_runner_output.req_id_to_index.get(req_id)
            req = self.requests.get(req_id)
            if idx is None or req is None or not sampled_ids or not drafts:
                continue
            n_out = len(sampled_ids[idx])
            if n_out == 0:
                continue
            results.append((req_id, _sampled(req), len(drafts), n_out - 1))
        out = super().update_from_output(scheduler_output, model_runner_output)
        self.specmoe_policy.observe_step(results)
        for req_id in scheduler_output.finished_req_ids:
            self.specmoe_policy.finished(req_id)
            self._line.forget(req_id)
        if self._log is not None and not self.running and not self.waiting:
            self._write_quiet()
            self._log.flush()  # idle: the log is complete up to here (not flushed per step: a write per step)
        return out

    def shutdown(self) -> None:
        if self._log is not None:
            self._write_quiet()
            self._log.close()
            self._log = None
        super().shutdown()
