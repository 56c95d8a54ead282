"""The simulated driver: the RL step loop on a virtual clock, with emulated rollout instances
and trainer, calling the same policy objects the runtime calls (allocator, dispatcher, ranker,
resize controller).

One step k, in every pipeline mode (docs/design.md invariant 4 fixes which weights it uses):

    weights  sync/stream: step k generates with weights version k (needs train k-1 + sync);
             async: with version k-1 (needs train k-2 + sync), so generation of step k overlaps
             training of step k-1 (StreamRL §4.1, one-step staleness).
    generate dispatcher.plan over the step's prompt groups (all G samples of a prompt on one
             instance, as the runtime's stream generation service does) -> each instance runs
             continuous batching (policy.cost kernel); every sample's finish time is exact on
             the virtual clock. With pipeline.assist (sync) the train devices are instances too,
             after the rollout ones, and each trains once its own generation is over. With
             workload.episode each sample is a multi-turn episode (policy/turns.py): its first
             turn as dispatched, later turns where the slot rule sends them after each
             environment wait; it is done when its last environment call answers. With partial
             rollouts (pipeline.partial_tokens) a phase of windows over a pool (sim/partial.py).
    train    by the step plan (policy.plan), as the runtime's trainer group does: canonical
             micro-batches of `cluster.micro_batch_size` samples by sample id (never by
             arrival: docs/design.md invariant 3), micro-batch j on its owner train device
             (contiguous ranges), each device training its own one after another. sync/async:
             from the end of generation; stream: each as soon as all its samples are in. With
             pipeline.assist, what has not started when generation ends is shared over the
             train and rollout devices (policy.plan.tail_shares). The optimizer step follows
             the last device.
    resize   the controller observes the step and may return a resize. The pipeline drains
             (in async, the in-flight generation of step k+1 finishes on the old split: the
             paper's "mixed step"), the critical-path phases block it, and the next train and
             generation run on the new split; a live resize's deferred optimizer restore
             overlaps the first train step and its optimizer step waits on it (§3.3).

In-flight generation at a resize (async only; in sync modes nothing is in flight): `drain`
(default, the paper's mixed step) lets it finish on the old split first; `abort` (docs/design.md,
Resize) stops it at the decision and resumes every unfinished sample as a partial sample on
the new split after the critical path, keeping the tokens it had (re-prefilled).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path
from typing import Any, Sequence

from poise.policy.allocator import DevicePlan, StepWorkload, allocate, plan_devices
from poise.policy.controller import ResizeDecision, ResizePolicy, StepObservation, make_resize_policy
from poise.policy.cost import instance_finish_times, percentile
from poise.policy.dispatch import DispatchPlan, InstanceInfo, build_dispatch
from poise.policy.pipeline import weights_version
from poise.policy.plan import StepPlan, plan_step, tail_shares
from poise.policy.rankers import Finished, Prompt
from poise.policy.scale import ScaleDecision, ScaleObservation, first_step_served, make_scale_policy
from poise.policy.split import Split, parse_splits
from poise.policy.turns import episode_times
from poise.runlog import RunLog
from poise.schema import dump
from poise.sim.partial import PartialRollouts, Phase
from poise.sim.pricing import make_cost
from poise.sim.scenario import ScenarioConfig
from poise.sim.summary import StepRecord, Summary, measured_break_even
from poise.sim.workload import SimSample, make_workload


class _NullLog:
    def event(self, kind: str, t: float, **fields: Any) -> None:
        pass

    def metrics(self, row: dict) -> None:
        pass

    def close(self) -> None:
        pass


class Simulation:
    """Runs one scenario; `run()` returns a Summary and (with a run_dir) writes the run log."""

    def __init__(self, sc: ScenarioConfig, run_dir: str | Path | None = None):
        self.sc = sc
        self.cost = make_cost(sc)
        self.workload = make_workload(sc.workload, sc.seed)
        c = sc.cluster
        self.tp = c.devices_per_instance
        self.sync_s = self.cost.sync_s()
        first = self.workload.step(0)
        self.prompt_len = _mean_prompt_len(first)
        self.split = sc.initial_split()
        self.roles = sc.roles()  # (rollout type, train type) with device types
        self.device_plan: DevicePlan | None = None  # the device planner's answer (split: auto with types)
        self.batch_cap = c.batch_cap
        # micro-batches per step, as the allocator and the controller price them
        self.micro_batches = micro_batches = len(self.plan(first, 1).minis[0].micro)
        if self.split is None:
            # What a user knows before the run: the first few steps' lengths (e.g. from a trace or
            # a dry run of the initial policy).
            works = [self.step_workload(self.workload.step(k)) for k in range(min(4, sc.steps))]
            fleet = sc.fleet()
            if fleet is not None:  # device types: the planner picks each role's type and count
                dplan = plan_devices(self.cost, fleet, works, sc.kind, c.budget_per_hour, self.tp,
                                     c.batch_caps or (c.batch_cap,), micro_batches)
                self.device_plan = dplan
                self.split, self.batch_cap = dplan.best.split, dplan.best.batch_cap
                self.roles = (dplan.best.rollout_type, dplan.best.train_type)
                self.cost = make_cost(sc, self.roles)
                self.sync_s = self.cost.sync_s()
            else:
                alloc = allocate(self.cost, works, c.devices, sc.kind, self.tp, c.batch_caps or (c.batch_cap,),
                                 parse_splits(sc.resize.allowed_splits) or None, micro_batches)
                self.split, self.batch_cap = alloc.split, alloc.batch_cap
        self._oracle: dict[str, float] = {}
        self.ranker, self.dispatcher = build_dispatch(sc.dispatch, sc.seed, self.cost, self.prompt_len,
                                                      sc.workload.samples_per_prompt,
                                                      oracle=lambda p: self._oracle[p.prompt_id])
        self.scaler = make_scale_policy(sc.scale, c.reserve_devices // self.tp)
        self.joined: list[tuple[int, float]] = []  # per joined instance: (first step it serves, ready at)
        self.joins: list[dict[str, Any]] = []
        self.controller: ResizePolicy = make_resize_policy(sc.resize, sc.controller, self.cost, sc.kind, c.devices,
                                                           self.tp, self.batch_cap, micro_batches)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.log: RunLog | _NullLog = RunLog(self.run_dir) if self.run_dir else _NullLog()
        self.records: list[StepRecord] = []
        self.decisions: list[ResizeDecision] = []
        self.resizes: list[dict[str, Any]] = []
        self._busy = {"rollout": 0.0, "train": 0.0}
        self._lent_end: dict[int, float] = {}  # pipeline.assist: train device -> end of its generation
        self._partial: dict[int, tuple[int, int]] = {}  # sample -> (aborted on, tokens kept)
        self._role_time = {"rollout": 0.0, "train": 0.0}
        self.partial = (PartialRollouts(sc.pipeline, self.workload, sc.workload.prompts_per_step)  # type: ignore[arg-type]
                        if sc.pipeline.partial else None)
        self.lags: dict[int, int] = {}  # trained output tokens by version lag (trained - generating version)

    # --- the driver loop ------------------------------------------------------------------
    def run(self) -> Summary:
        sc = self.sc
        if self.run_dir:
            dump(sc, self.run_dir / "config.yaml")
        if self.device_plan is not None:  # what the device planner chose, and why
            d = self.device_plan.best
            self.log.event("decision", 0.0, what="devices", to=str(d), rollout_type=d.rollout_type,
                           train_type=d.train_type, split=d.split.as_list(), batch_cap=d.batch_cap,
                           price_per_hour=d.price_per_hour, predicted_step_s=d.predicted.step_s,
                           predicted_tokens_per_dollar=d.tokens_per_dollar,
                           reason=f"most generated tokens per dollar within 3% of the most throughput "
                                  f"${self.device_plan.budget_per_hour:g}/h buys")
        initial = self.split
        train_end: list[float] = []
        gen_free = 0.0  # rollout instances free (previous generation or a resize done)
        train_free = 0.0  # train devices free
        bg_ready = 0.0  # deferred optimizer restore of a live resize done
        pending: ResizeDecision | None = None
        for k in range(sc.steps):
            resized = 0.0  # critical-path seconds of a resize inside this step
            samples = self.workload.step(k)
            version = weights_version(k, sc.kind)
            ready = train_end[version - 1] + self.sync_s if version >= 1 else 0.0
            if pending is not None and sc.kind != "async":  # nothing in flight: resize now
                end, bg_ready = self._resize(pending, train_end[-1], k)
                gen_free = train_free = end
                ready = max(ready, end + self.sync_s)
                pending, resized = None, end - train_end[-1]
            gen_start = max(ready, gen_free)
            abort_at = train_end[-1] if pending is not None and sc.resize.inflight == "abort" else None
            phase = self.partial.phase(k, version, gen_start, self.generate) if self.partial else None
            if phase is not None:  # partial rollouts (sim/partial.py): the phase's windows and its batch
                samples, finish, instance_of, gen_end = phase.samples, phase.finish, phase.instance, phase.end
            else:
                finish, instance_of, admitted = self.generate(k, samples, gen_start, abort_at)
                gen_end = max(finish)
            gen_free = gen_end
            if pending is not None and abort_at is not None and gen_end > abort_at:
                # async, abort: stop step k's generation at the decision, resize, and resume the
                # unfinished samples as partial samples on the new split (nothing is lost).
                end, bg_ready = self._resize(pending, abort_at, k)
                finish, instance_of = self.resume(k, samples, finish, admitted, instance_of, abort_at, end)
                gen_free = gen_end = max(finish)
                train_free = end
                pending, resized = None, end - abort_at
            elif pending is not None:  # async, drain: step k's generation finished on the old split
                end, bg_ready = self._resize(pending, max(train_end[-1], gen_end), k)
                gen_free = train_free = end
                pending, resized = None, end - max(train_end[-1], gen_end)
            self.ranker.observe([Finished(s.prompt, s.output_length) for s in samples])
            batch = self.trained(samples, finish)
            train_start, t_end, train_busy = self.train(*batch, gen_end, train_free, bg_ready)
            for lag, n in (phase.lags if phase else {k - version: sum(s.output_length for s in batch[0])}).items():
                self.lags[lag] = self.lags.get(lag, 0) + n
            train_free = t_end
            prev = train_end[-1] if train_end else 0.0
            train_end.append(t_end)
            rec = StepRecord(k, self.split, gen_start, gen_end, train_start, t_end, gen_end - gen_start,
                             train_busy, self.sync_s, t_end - prev,
                             sum(s.output_length for s in samples), resized, len(batch[0]))
            self.records.append(rec)
            self._account(rec)
            self._log_step(rec, samples, finish, instance_of, version, phase)
            decision = self.maybe_resize(rec, samples)
            self.maybe_scale(rec)
            if decision is not None and decision.action == "resize":
                pending = decision
        summary = self.summary(initial)
        self.log.close()
        if self.run_dir:
            import json

            (self.run_dir / "summary.json").write_text(json.dumps(summary.as_dict(), indent=1))
        return summary

    def step_workload(self, samples: list[SimSample]) -> StepWorkload:
        """What the allocator and the controller price of a step: lengths, or an agent job's episodes."""
        episode = self.sc.workload.episode
        return StepWorkload(tuple(s.output_length for s in samples), self.prompt_len,
                            tuple(s.episode for s in samples if s.episode is not None),
                            episode.slots if episode else "refill")

    # --- phases ---------------------------------------------------------------------------
    def trained(self, samples: list[SimSample], finish: list[float]) -> tuple[list[SimSample], list[float]]:
        """Dynamic sampling (workload.drop_rate): the groups that train, each relabelled to its slot
        (policy/dynamic.py): the kept draws in draw order, then, where the draws ran out, the
        earliest dropped ones. Departure from the runtime: a slot is ready when its own group
        finishes, not once every draw before it is resolved too."""
        if not any(s.dropped for s in samples):
            return samples, finish
        draws = sorted({s.sample_id[1]: s.dropped for s in samples}.items())
        prompts = self.sc.workload.prompts_per_step
        slots = ([d for d, dropped in draws if not dropped] + [d for d, dropped in draws if dropped])[:prompts]
        slot_of = {d: i for i, d in enumerate(slots)}
        kept = [(dataclasses.replace(s, sample_id=(s.sample_id[0], slot_of[s.sample_id[1]], s.sample_id[2])), f)
                for s, f in zip(samples, finish) if s.sample_id[1] in slot_of]
        kept.sort(key=lambda x: x[0].sample_id)
        return [s for s, _ in kept], [f for _, f in kept]

    def plan(self, samples: list[SimSample], train_devices: int) -> StepPlan:
        """The step plan of `samples` (one step's). A replayed trace may give a prompt fewer
        samples than its largest group: those ids of the plan's grid are holes that weigh nothing."""
        return plan_step(samples[0].sample_id[0], 1 + max(s.sample_id[1] for s in samples),
                         1 + max(s.sample_id[2] for s in samples), micro_batch_size=self.sc.cluster.micro_batch_size,
                         train_devices=train_devices, mode=self.sc.kind)

    @staticmethod
    def groups(samples: list[SimSample], members: Sequence[int]) -> tuple[list[Prompt], list[list[int]]]:
        """The prompt groups of `members` (positions in `samples`), in prompt-index order: one
        Prompt each, the dispatch unit, and its members in sample-index order."""
        by_prompt: dict[int, list[int]] = {}
        for i in members:
            by_prompt.setdefault(samples[i].sample_id[1], []).append(i)
        order = sorted(by_prompt)
        groups = [sorted(by_prompt[p], key=lambda i: samples[i].sample_id[2]) for p in order]
        return [samples[g[0]].prompt for g in groups], groups

    def generate(self, k: int, samples: list[SimSample], start: float, abort_at: float | None = None
                 ) -> tuple[list[float], list[int], list[float]]:
        """Dispatch step k's prompt groups and run every instance's continuous batching from
        `start`. Returns finish time, instance and admission time per sample; with `abort_at`,
        busy intervals are cut there (the caller resumes what had not finished)."""
        by_prompt: dict[str, list[int]] = {}
        for s in samples:
            by_prompt.setdefault(s.prompt.prompt_id, []).append(s.output_length)
        self._oracle = {pid: sum(v) / len(v) for pid, v in by_prompt.items()}
        n_inst = self.instances(k)
        # pipeline.assist (sync only, as the config enforces): the train devices generate too, after the rollout ones
        n_lent = self.split.train // self.tp if self.sc.pipeline.assist else 0
        prompts, members = self.groups(samples, range(len(samples)))
        plan = self.dispatcher.plan(prompts, [InstanceInfo(i, self.batch_cap) for i in range(n_inst + n_lent)])
        queues: dict[int, list[int]] = {i: [] for i in range(n_inst + n_lent)}
        for group, inst in plan.order:  # a prompt's samples follow it, in sample-index order
            queues[inst] += members[group]
        if self.sc.workload.episode is not None:
            return self.generate_episodes(k, samples, start, queues, plan, n_inst)
        finish = [0.0] * len(samples)
        instance_of = [0] * len(samples)
        admitted = [0.0] * len(samples)
        self._lent_end = {}  # train device -> when its own generation ends (it trains after)
        for inst, reqs in queues.items():
            adm = [0.0] * len(reqs)
            lent = inst >= n_inst  # a train device's instance: it holds the step's weights from the start
            begin = start if lent else max(start, self._ready(inst))  # a joined instance: once its weights arrived
            times = instance_finish_times(self.cost, [samples[r].output_length for r in reqs],
                                          [samples[r].prompt_len for r in reqs], plan.batch_caps[inst],
                                          begin, adm)
            for r, t, a in zip(reqs, times, adm):
                finish[r], instance_of[r], admitted[r] = t, inst, a
            if reqs:
                end = max(times) if abort_at is None else min(max(times), max(abort_at, begin))
                self._busy["rollout"] += (end - begin) * self.tp
                first = self.split.rollout + (inst - n_inst) * self.tp if lent else None
                self._interval_instance(inst, "rollout", "generate", k, begin, end, first)
                if lent:
                    self._lent_end.update(dict.fromkeys(range((inst - n_inst) * self.tp,
                                                              (inst - n_inst + 1) * self.tp), end))
        if plan.tail_instances or self.sc.dispatch.policy == "skew_aware":
            self.log.event("decision", start, what="dispatch", step=k, reason=plan.reason,
                           tail_instances=list(plan.tail_instances))
        self._partial = {}
        return finish, instance_of, admitted

    def generate_episodes(self, k: int, samples: list[SimSample], start: float, queues: dict[int, list[int]],
                          plan: DispatchPlan, n_inst: int) -> tuple[list[float], list[int], list[float]]:
        """`generate` for multi-turn episodes (policy/turns.py): the first turns as dispatched, each
        later turn where the slot rule sends it; a sample is done when its last environment call
        answers. An instance is busy only while it prefills or decodes, not while episodes wait."""
        n = len(queues)
        begins = [start if i >= n_inst else max(start, self._ready(i)) for i in range(n)]
        rule = self.sc.workload.episode.slots  # type: ignore[union-attr]
        times = episode_times(self.cost, [s.episode for s in samples], [queues[i] for i in range(n)],  # type: ignore[misc]
                              [plan.batch_caps[i] for i in range(n)], begins, rule)
        self._lent_end = {}
        for inst in range(n):
            if not queues[inst] and not times.busy_s[inst]:
                continue
            lent = inst >= n_inst
            self._busy["rollout"] += times.busy_s[inst] * self.tp
            first = self.split.rollout + (inst - n_inst) * self.tp if lent else None
            self._interval_instance(inst, "rollout", "generate", k, begins[inst], times.end[inst], first)
            if lent:
                self._lent_end.update(dict.fromkeys(range((inst - n_inst) * self.tp,
                                                          (inst - n_inst + 1) * self.tp), times.end[inst]))
        if plan.tail_instances or self.sc.dispatch.policy == "skew_aware":
            self.log.event("decision", start, what="dispatch", step=k, reason=plan.reason,
                           tail_instances=list(plan.tail_instances))
        self._partial = {}
        return times.finish, times.instance, [start] * len(samples)

    def resume(self, k: int, samples: list[SimSample], finish: list[float], admitted: list[float],
               instance_of: list[int], abort_at: float, start: float) -> tuple[list[float], list[int]]:
        """Samples unfinished at `abort_at` continue on the new split from `start` as partial
        samples: the tokens generated so far are kept (re-prefilled with the prompt to rebuild
        the KV cache), only the rest is decoded. Progress at the abort is interpolated in time."""
        partial = {}
        for i, s in enumerate(samples):
            if finish[i] > abort_at:
                a = admitted[i]
                done = 0 if a >= abort_at else int(s.output_length * (abort_at - a) / (finish[i] - a))
                partial[i] = min(max(done, 0), s.output_length - 1)
        n_inst = self.instances(k)
        prompts, members = self.groups(samples, list(partial))
        plan = self.dispatcher.plan(prompts, [InstanceInfo(j, self.batch_cap) for j in range(n_inst)])
        queues: dict[int, list[int]] = {j: [] for j in range(n_inst)}
        for group, inst in plan.order:  # a prompt's unfinished samples stay together
            queues[inst] += members[group]
        finish, instance_of = list(finish), list(instance_of)
        for inst, reqs in queues.items():
            if not reqs:
                continue
            times = instance_finish_times(
                self.cost, [samples[i].output_length - partial[i] for i in reqs],
                [samples[i].prompt_len + partial[i] for i in reqs], plan.batch_caps[inst], start)
            for i, t in zip(reqs, times):
                self._partial[i] = (instance_of[i], partial[i])
                finish[i], instance_of[i] = t, inst
            self._busy["rollout"] += (max(times) - start) * self.tp
            self._interval_instance(inst, "rollout", "generate_resumed", k, start, max(times))
        return finish, instance_of

    def train(self, samples: list[SimSample], finish: list[float], gen_end: float, free: float,
              bg_ready: float) -> tuple[float, float, float]:
        """Train step on `self.split.train` devices by the step plan; returns (start, end, busy
        seconds of the busiest train device)."""
        t_dev = self.split.train
        cost = self.cost
        k = samples[0].sample_id[0]
        mini = self.plan(samples, t_dev).minis[0]
        # tokens forward/backward processes per micro-batch (a replayed trace's holes weigh nothing)
        size = {s.sample_id: s.tokens for s in samples}
        tokens = [sum([size.get(sid, 0) for sid in ids]) for ids in mini.micro]
        stream = self.sc.kind == "stream"
        ready: list[float] = []  # stream: when each micro-batch's last sample is in (otherwise all at gen_end)
        if stream:
            done = {s.sample_id: f for s, f in zip(samples, finish)}
            ready = [max([done.get(sid, 0.0) for sid in ids]) for ids in mini.micro]
        # pipeline.assist: what has not started when generation ends is shared with the rollout
        # devices (policy.plan.tail_shares, as the runtime's trainer group does)
        helpers = self.split.rollout if self.sc.pipeline.assist else 0
        pending = [j for j in range(len(mini.micro)) if not stream or ready[j] >= gen_end] if helpers else []
        shares = tail_shares(pending, t_dev + helpers, [tokens[j] for j in pending]) if helpers else []
        tail = set(pending)
        queues = [[j for j in range(lo, hi) if j not in tail] + (shares[d] if shares else [])
                  for d, (lo, hi) in enumerate(mini.ranges)]
        queues += shares[t_dev:]
        start, end, busiest, busy_sum = math.inf, free, 0.0, 0.0
        for d, queue in enumerate(queues):
            t, busy, begun = (free, 0.0, None) if stream else (max(free, gen_end), 0.0, None)
            if d >= t_dev:  # a helping rollout device: free once generation ends
                t = gen_end
            else:  # a train device that generated (pipeline.assist): free once its own generation ends
                t = max(t, self._lent_end.get(d, 0.0))
            # stream: its micro-batches as they complete; otherwise in index order
            for j in sorted(queue, key=lambda j: (ready[j], j)) if stream else queue:
                if tokens[j] == 0:
                    continue
                begin = max(t, ready[j]) if stream else t
                begun = begin if begun is None else begun
                dt = cost.train_compute_s(tokens[j], 1)
                t = begin + dt
                busy += dt
                if stream:
                    self._interval_train_device(d, k, "train_microbatch", begin, t)
            if begun is not None:
                start = min(start, begun)
                if not stream:
                    self._interval_train_device(d, k, "train", begun, t)
            end, busiest, busy_sum = max(end, t), max(busiest, busy), busy_sum + busy
        start = min(start, end)
        self._interval_train(k, "train", start, end, per_device=False)
        # the reduction spans the helpers too when they hold work (as the runtime's all-gather)
        fixed = cost.train_fixed_s(t_dev + (helpers if any(shares[t_dev:]) else 0))
        opt_start = max(end, bg_ready)
        end = opt_start + fixed
        self._interval_train(k, "optimizer_step", opt_start, end)
        self._busy["train"] += busy_sum + fixed * t_dev
        return start, end, busiest + fixed

    def maybe_resize(self, rec: StepRecord, samples: list[SimSample]) -> ResizeDecision | None:
        if rec.resize_s > 0:
            # The step that absorbed a resize mixes two splits (in async its generation ran on
            # the old one): nothing the controller should calibrate on, and it is in cooldown.
            return None
        work = self.step_workload(samples)
        obs = StepObservation(rec.step, rec.train_end, rec.split, rec.rollout_s, rec.train_s, rec.step_s,
                              work.output_lengths, _mean_prompt_len(samples), episodes=work.episodes,
                              slots=work.slots)
        decision = self.controller.observe(obs)
        self.decisions.append(decision)
        if decision.action == "resize" or decision.signal:
            self.log.event("decision", rec.train_end, **decision.event_fields())
        return decision

    # --- elastic scale-out (policy/scale.py) ----------------------------------------------------
    def instances(self, k: int) -> int:
        """Rollout instances that generate step k: the split's, and the joined ones serving by then."""
        return self.split.rollout // self.tp + sum(1 for first, _ in self.joined if first <= k)

    def _ready(self, inst: int) -> float:
        """When instance `inst` can start generating (0 for the pool's own)."""
        j = inst - self.split.rollout // self.tp
        return self.joined[j][1] if j >= 0 else 0.0

    def maybe_scale(self, rec: StepRecord) -> ScaleDecision | None:
        """The scale policy observes the step; a join takes a reserve device, which receives the
        weights (one broadcast: `sync_s`) and serves from the first step the runtime would not have
        dispatched yet (`first_step_served`)."""
        if not self.sc.scale.active:
            return None
        held = self.split.rollout // self.tp + len(self.joined)
        decision = self.scaler.observe(ScaleObservation(rec.step, rec.rollout_s, rec.train_s, held), rec.train_end)
        self.log.event("decision", rec.train_end, **decision.event_fields())
        if decision.action != "add":
            return decision
        first = first_step_served(rec.step, self.sc.kind)
        for _ in range(decision.target - decision.current):
            if len(self.joined) >= self.sc.cluster.reserve_devices // self.tp:
                break  # the reserve is spent (the controller's cap; a schedule is checked at load)
            ready = rec.train_end + self.sync_s
            devices = [self.sc.cluster.devices + len(self.joined) * self.tp + i for i in range(self.tp)]
            self.joined.append((first, ready))
            join = {"step": rec.step, "at_s": rec.train_end, "ready_s": ready, "first_step": first,
                    "devices": devices, "instances": self.split.rollout // self.tp + len(self.joined),
                    "reason": decision.reason}
            self.joins.append(join)
            self.log.event("join", rec.train_end, **join)
        return decision

    def _resize(self, decision: ResizeDecision, start: float, step: int) -> tuple[float, float]:
        """Apply a resize from `start`; returns (critical path end, background restore end)."""
        old, new = self.split, decision.target
        price = self.cost.resize(self.sc.resize.mode)
        moving = range(min(old.rollout, new.rollout), max(old.rollout, new.rollout))
        t = start
        phases = {}
        for name, seconds in price.phases:
            for dev in moving:
                self._interval(dev, "resize", name, step, t, t + seconds)
            phases[name] = seconds
            t += seconds
        bg_end = t
        if new.train > old.train:  # devices joining the trainer restore optimizer state (§3.3)
            for name, seconds in price.background:
                for dev in moving:
                    self._interval(dev, "resize", name, step, bg_end, bg_end + seconds, background=True)
                bg_end += seconds
        self.log.event("resize", start, step=step, from_split=old.as_list(), to_split=new.as_list(),
                       mode=price.mode, phases=phases, critical_path_s=price.critical_path_s,
                       background_s=bg_end - t, start=start, end=t)
        self.resizes.append({"step": step, "at_s": start, "from": old.as_list(), "to": new.as_list(),
                             "mode": price.mode, "critical_path_s": price.critical_path_s,
                             "reason": decision.reason, "break_even_steps": decision.estimate.break_even_steps,
                             "decided_after_step": decision.step})
        self.controller.resized(price.critical_path_s)
        self.split = new
        return t, bg_end

    # --- logging and accounting -------------------------------------------------------------
    def _interval(self, device: int, role: str, phase: str, step: int, start: float, end: float,
                  **extra: Any) -> None:
        if self.sc.log.intervals != "none" and end > start:
            self.log.event("interval", end, device=device, role=role, phase=phase, step=step,
                           start=start, end=end, **extra)

    def _interval_instance(self, inst: int, role: str, phase: str, step: int, start: float, end: float,
                           first: int | None = None) -> None:
        """`first`: the instance's first device where the instance number does not say (a lent one)."""
        mode = self.sc.log.intervals
        base = self.split.rollout // self.tp  # a joined instance's devices follow the pool's
        if first is None:
            first = inst * self.tp if inst < base else self.sc.cluster.devices + (inst - base) * self.tp
        if mode == "device":
            for d in range(first, first + self.tp):
                self._interval(d, role, phase, step, start, end)
        elif mode == "instance":
            self._interval(first, role, phase, step, start, end, devices=self.tp)

    def _interval_train(self, step: int, phase: str, start: float, end: float, per_device: bool = True) -> None:
        """An interval of the whole train group: on every train device, or (intervals: instance)
        one row for the group; `per_device=False` logs it only as the group's row."""
        mode = self.sc.log.intervals
        first = self.split.rollout
        if mode == "device" and per_device:
            for d in range(first, first + self.split.train):
                self._interval(d, "train", phase, step, start, end)
        elif mode == "instance":
            self._interval(first, "train", phase, step, start, end, devices=self.split.train)

    def _interval_train_device(self, d: int, step: int, phase: str, start: float, end: float) -> None:
        """Work of train device `d` (position in the train group; from `split.train` on, the
        helping rollout devices of pipeline.assist) alone (intervals: device)."""
        if self.sc.log.intervals == "device":
            t_dev = self.split.train
            self._interval(self.split.rollout + d if d < t_dev else d - t_dev, "train", phase, step, start, end)

    def _account(self, rec: StepRecord) -> None:
        self._role_time["rollout"] += rec.split.rollout * rec.step_s
        start = rec.train_end - rec.step_s  # joined devices are held from their join on
        self._role_time["rollout"] += self.tp * sum(max(0.0, rec.train_end - max(start, j["at_s"]))
                                                    for j in self.joins)
        self._role_time["train"] += rec.split.train * rec.step_s

    def _log_step(self, rec: StepRecord, samples: list[SimSample], finish: list[float],
                  instance_of: list[int], version: int, phase: Phase | None) -> None:
        lens = [s.output_length for s in samples]
        extra_metrics = phase.metrics if phase is not None else {}
        if self.sc.log.samples:
            for i, (s, f, inst) in enumerate(zip(samples, finish, instance_of)):
                # partial rollouts: the slot's group (origin step, prompt index), as the runtime logs it
                extra: dict = {"draw": list(phase.groups[s.sample_id[1]])} if phase is not None else {}
                if i in self._partial:  # aborted by a resize and resumed elsewhere
                    extra.update(aborted_on=self._partial[i][0], resumed_after_tokens=self._partial[i][1])
                self.log.event("sample", f, id=list(s.sample_id), step=rec.step, prompt_id=s.prompt.prompt_id,
                               output_length=s.output_length, weights_version=version, instance=inst,
                               submit=rec.gen_start, finish=f, **extra)
        start = rec.train_end - rec.step_s
        self.log.event("step", rec.train_end, step=rec.step, start=start, end=rec.train_end,
                       rollout_s=rec.rollout_s, train_s=rec.train_s, sync_s=rec.sync_s, reward_mean=None,
                       tokens=rec.tokens, split=rec.split.as_list())
        self.log.metrics({
            "step": rec.step, "reward_mean": None, "response_len_mean": sum(lens) / len(lens),
            "response_len_p50": percentile(lens, 0.5), "response_len_p99": percentile(lens, 0.99),
            "response_len_max": max(lens), "step_s": rec.step_s,
            "phases": {"rollout": rec.rollout_s, "train": rec.train_s, "sync": rec.sync_s},
            "tokens_per_s": rec.tokens / rec.step_s if rec.step_s > 0 else None,
            "split": rec.split.as_list(), "time_s": rec.train_end, **extra_metrics,
        })

    def summary(self, initial: Split) -> Summary:
        recs = self.records
        total = recs[-1].train_end
        tokens = sum(r.tokens for r in recs)
        steps = [r.step_s for r in recs]
        idle = {role: (1.0 - self._busy[role] / self._role_time[role]) if self._role_time[role] else 0.0
                for role in ("rollout", "train")}
        s = Summary(self.sc.name, self.sc.kind, len(recs), total, tokens, tokens / total,
                    statistics.fmean(steps), statistics.median(steps),
                    statistics.fmean(r.rollout_s for r in recs), statistics.fmean(r.train_s for r in recs),
                    idle, initial.as_list(), self.split.as_list(), list(self.resizes))
        s.joins = list(self.joins)
        s.device_s = self.sc.cluster.devices * total + sum(self.tp * (total - j["at_s"]) for j in self.joins)
        s.tokens_per_device_s = tokens / s.device_s
        s.samples_per_s, s.tokens_by_lag = sum(r.samples for r in recs) / total, dict(sorted(self.lags.items()))
        if self.resizes:
            first = self.resizes[0]
            s.break_even_steps = first["break_even_steps"]
            s.break_even_steps_measured = measured_break_even(steps, first["decided_after_step"],
                                                              first["critical_path_s"])
        return s


def _mean_prompt_len(samples: list[SimSample]) -> int:
    return int(round(sum(s.prompt_len for s in samples) / len(samples))) if samples else 0


def simulate(sc: ScenarioConfig, run_dir: str | Path | None = None) -> Summary:
    return Simulation(sc, run_dir).run()


__all__ = ["Simulation", "Summary", "StepRecord", "simulate", "make_cost", "measured_break_even"]
