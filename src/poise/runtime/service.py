"""Stream generation service (StreamRL §3): rollout instances fed by the policy dispatcher, each
finished sample handed on as soon as the driver asks.

Per step, the dispatcher (`poise.policy.dispatch`) plans which instance serves which prompt and in
what order, and each instance's live-batch cap. All G samples of a prompt go to one instance (the
dispatch unit is the prompt group, in the simulator too). Each instance gets its whole queue in one
`submit`; its engine loop (runtime/roles.py EngineLoop) admits at most `cap` at a time and keeps
generating whatever the driver does. The service waits on every instance at once (`ray.wait`) and
yields finished samples in batches.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import ray
from ray.exceptions import RayActorError, RayTaskError

from poise.data.tasks import Problem
from poise.policy.dispatch import Dispatcher, DispatchPlan, InstanceInfo
from poise.policy.rankers import Finished, LengthRanker, Prompt
from poise.runtime.faults import StepTimeout, hang_message, lost_or_raise
from poise.types import Request, Sample, SampleId


@dataclass
class _Instance:
    worker: object  # DeviceWorker handle
    device: int
    in_flight: int = 0
    unseen: int = 0  # requests handed in while a `take` was outstanding (it could not count them)
    taking: bool = False  # a `take` of this instance is outstanding


# How long an instance holds a finished sample back for the ones finishing right after it, so
# that one reply carries them (the last sample of a generation is never held). Each reply wakes
# the actor's thread beside its engine's; in sync 1+1 with pipeline.assist (count workload,
# benchmarks/control_plane.py) 30 ms raised samples/s in 5 of 6 interleaved pairs of runs (the
# sixth: equal). A micro-batch that completes mid-generation starts at most this much later.
TAKE_LINGER_S = 0.03


class StreamGenerationService:
    def __init__(self, workers: Sequence[object], devices: Sequence[int], dispatcher: Dispatcher,
                 ranker: LengthRanker | None, group_size: int, num_slots: int, take_seconds: float = 0.5,
                 step_timeout_s: float = 600.0, lenders: Sequence[object] = (), lender_devices: Sequence[int] = ()):
        self.step_timeout_s = step_timeout_s  # an instance with work and no engine step this long is hung
        self.instances = [_Instance(w, d) for w, d in zip(workers, devices)]
        self.set_lenders(lenders, lender_devices)
        self.dispatcher, self.ranker = dispatcher, ranker
        self.group_size, self.num_slots, self.take_seconds = group_size, num_slots, take_seconds
        self.instance_of: dict[SampleId, int] = {}  # sample id -> device that generated it
        self.busy: dict[int, list[tuple[int, float, float]]] = defaultdict(list)  # step -> (device, start, end)
        self._prompts: dict[tuple[int, int], Prompt] = {}  # (step, prompt index) -> prompt, until observed
        self._step = -1
        self._caps: dict[int, int] = {}  # device -> live-batch cap of the step in flight
        self.carried: list[Sample] = []  # finished on a device a resize took, not yet streamed

    def set_lenders(self, lenders: Sequence[object], lender_devices: Sequence[int]) -> None:
        """`pipeline.assist` (sync): the train devices, which hold the step's weights while it
        generates, take prompt groups too; they receive no weight sync (they made the weights)."""
        self.lent = [_Instance(w, d) for w, d in zip(lenders, lender_devices)]

    @property
    def generating(self) -> list[_Instance]:
        """The instances a step's generation is planned over: rollout devices, then lent ones."""
        return self.instances + self.lent

    def start_step(self, step: int, problems: Sequence[Problem], prompt_ids: Sequence[Sequence[int]],
                   requests: Mapping[SampleId, Request] | None = None) -> DispatchPlan:
        """Plan the step's prompt groups over the instances and hand every instance its queue
        (`requests`: each sample's own first request, an episode's first turn, instead of the prompt's)."""
        prompts = [Prompt(p.uid, p.prompt) for p in problems]
        instances = self.generating
        plan = self.dispatcher.plan(prompts, [InstanceInfo(i, self.num_slots) for i in range(len(instances))])
        queues: list[list[Request]] = [[] for _ in instances]
        for prompt_index, instance_id in plan.order:
            self._prompts[(step, prompt_index)] = prompts[prompt_index]
            for j in range(self.group_size):
                sid = (step, prompt_index, j)
                if requests is None:
                    queues[instance_id].append(Request(sid, prompt_ids[prompt_index]))
                elif sid in requests:  # an episode that ended at its reset has no turn to generate
                    queues[instance_id].append(requests[sid])
                self.instance_of[(step, prompt_index, j)] = instances[instance_id].device
        caps = [max(1, min(self.num_slots, plan.batch_caps.get(i, self.num_slots))) for i in range(len(queues))]
        self._caps = {inst.device: cap for inst, cap in zip(instances, caps)}
        # not awaited: an actor runs one caller's calls in order, so every `take` comes after its
        # `submit`, and a failed submit surfaces there (a lent train device runs it after its update)
        for inst, q, cap in zip(instances, queues, caps):
            if q:
                inst.worker.submit.remote(q, cap)
        for inst, q in zip(instances, queues):
            inst.in_flight, inst.unseen = len(q), 0
        self._step = step
        return plan

    def extend(self, step: int, problems: Sequence[Problem], prompt_ids: Sequence[Sequence[int]],
               draws: Sequence[int]) -> None:
        """Dynamic sampling: generate more prompt groups for step `step` while its `stream` runs
        (draw d's samples are (step, d, j)), each on the instance with the least in flight (which
        instance runs a group changes no token). `stream` takes them like the step's own."""
        for problem, ids, draw in zip(problems, prompt_ids, draws):
            inst = min(self.generating, key=lambda i: (i.in_flight + i.unseen, i.device))
            self._prompts[(step, draw)] = Prompt(problem.uid, problem.prompt)
            requests = [Request((step, draw, j), ids) for j in range(self.group_size)]
            for r in requests:
                self.instance_of[r.sample_id] = inst.device
            inst.worker.submit.remote(requests, self._caps.get(inst.device, self.num_slots))
            # counted when its next take is issued: an outstanding take (the actor runs calls in
            # order) reports counts from before this submit, and an idle instance's heartbeat restarts then
            inst.unseen += len(requests)

    def submit_turns(self, requests: Sequence[Request]) -> None:
        """Episodes: next turns, each to the instance that ran the episode's last turn (the
        dispatcher's placement holds for the whole episode: a long-tail group stays on its
        small-batch instance), or, where that device no longer generates (a resize, a death), to the
        one with the least in flight. Which instance runs a turn changes no token (the turn re-fills
        the episode so far). `stream` takes them like the step's own."""
        work: dict[int, list[Request]] = {}
        by_device = {inst.device: inst for inst in self.generating}
        for request in requests:
            inst = by_device.get(self.instance_of.get(tuple(request.sample_id), -1)) or \
                min(self.generating, key=lambda i: (i.in_flight + i.unseen, i.device))
            work.setdefault(inst.device, []).append(request)
            inst.unseen += 1
            self.instance_of[tuple(request.sample_id)] = inst.device
        for inst in self.generating:
            if inst.device in work:
                inst.worker.submit.remote(work[inst.device], self._caps.get(inst.device, self.num_slots))

    def stream(self, heartbeat: bool = False) -> Iterator[list[Sample]]:
        """Yield the step's finished samples in batches, as they come, until every one is out
        (work `extend` or `submit_turns` hands in meanwhile included). `heartbeat`: yield an empty
        batch too each time a wait ends with none (at most take_seconds apart while generating), so
        the caller can hand in work that did not come from a sample (an environment's answer)."""
        if self.carried:
            batch, self.carried = self.carried, []
            yield batch
        refs: dict = {}
        for inst in self.generating:  # a stream cut short (a worker died) left no take of its own behind
            inst.taking = False

        # the heartbeat: each instance's engine step count and when it last changed
        progress = {inst.device: (-1, time.time()) for inst in self.generating}

        def take_from_busy_instances() -> None:
            for inst in self.generating:
                if (inst.in_flight or inst.unseen) and not inst.taking:
                    if not inst.in_flight:  # idle until `extend` woke it: that silence was no hang
                        progress[inst.device] = (progress.get(inst.device, (-1, 0.0))[0], time.time())
                    inst.in_flight, inst.unseen, inst.taking = inst.in_flight + inst.unseen, 0, True
                    refs[inst.worker.take.remote(self.take_seconds, TAKE_LINGER_S)] = inst

        take_from_busy_instances()
        while refs:
            ray.wait(list(refs), num_returns=1, timeout=self.step_timeout_s)  # the first instance with news ...
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)  # ... and every other one
            now = time.time()
            silent = sorted(i.device for i in refs.values() if now - progress[i.device][1] > self.step_timeout_s)
            if silent:
                raise StepTimeout(hang_message(None, silent, f"generation of step {self._step}", self.step_timeout_s,
                                               "rollout"))
            batch: list[Sample] = []
            for ref in ready:
                inst = refs.pop(ref)
                inst.taking = False
                try:
                    finished, inst.in_flight, busy, steps = ray.get(ref)
                except (RayActorError, RayTaskError) as e:
                    raise lost_or_raise(None, e, [inst.device], f"generation of step {self._step}") from e
                if steps != progress.get(inst.device, (-1,))[0] or finished:
                    progress[inst.device] = (steps, now)
                self.busy[self._step] += [(inst.device, start, end) for start, end in busy]
                batch.extend(finished)
            take_from_busy_instances()
            if batch or heartbeat:
                yield batch
                take_from_busy_instances()  # the caller may have extended the step meanwhile

    # --- live resize -----------------------------------------------------------------------------
    def remove_instances(self, devices: Sequence[int]) -> None:
        """Devices leaving the rollout role (their work was taken back with `abort_generation`)."""
        self.instances = [inst for inst in self.instances if inst.device not in devices]

    def add_instances(self, workers: Sequence[object], devices: Sequence[int]) -> None:
        """Devices joining the rollout role; the dispatcher plans over them from the next step."""
        self.instances = sorted(self.instances + [_Instance(w, d) for w, d in zip(workers, devices)],
                                key=lambda inst: inst.device)

    def continue_partials(self, step: int, partials: Sequence[Sample], windows: Mapping[SampleId, int]) -> None:
        """Partial rollouts (runtime/partial.py): a window of the generation for step `step` over the
        pool's unfinished samples, each decoding at most windows[id] more tokens (one not named
        there: to its end); `stream` takes them back, finished or not."""
        self._step = step
        self.hand_over([], partials, [], windows)

    def hand_over(self, finished: Sequence[Sample], partials: Sequence[Sample], requests: Sequence[Request],
                  windows: Mapping[SampleId, int] | None = None) -> int:
        """A leaving device's work: its finished samples wait for the next `stream`; its partial
        samples and unstarted requests go, a prompt group at a time, to the instance with the
        least in flight (which sample runs where changes no token). Returns the samples moved."""
        self.carried.extend(finished)
        groups: dict[tuple[int, int], tuple[list[Sample], list[Request]]] = {}
        for p in partials:
            groups.setdefault(tuple(p.sample_id[:2]), ([], []))[0].append(p)
        for r in requests:
            groups.setdefault(tuple(r.sample_id[:2]), ([], []))[1].append(r)
        work: dict[int, tuple[list[Sample], list[Request]]] = {}
        for key in sorted(groups):
            inst = min(self.instances, key=lambda i: (i.in_flight, i.device))
            parts, reqs = groups[key]
            mine = work.setdefault(inst.device, ([], []))
            mine[0].extend(parts)
            mine[1].extend(reqs)
            inst.in_flight += len(parts) + len(reqs)
            for sid in [p.sample_id for p in parts] + [r.sample_id for r in reqs]:
                self.instance_of[tuple(sid)] = inst.device
        for inst in self.instances:
            if inst.device in work:
                parts, reqs = work[inst.device]
                budgets = {p.sample_id: windows[p.sample_id] for p in parts if p.sample_id in windows} \
                    if windows else None
                inst.worker.resume_generation.remote(parts, reqs, self._caps.get(inst.device, self.num_slots), budgets)
        return len(partials) + len(requests)

    def observe(self, samples: Sequence[Sample]) -> None:
        """Feed finished lengths to the ranker (the history/learned rankers learn from them)."""
        seen = [(s.sample_id[0], s.sample_id[1]) for s in samples]
        if self.ranker is not None:
            self.ranker.observe([Finished(self._prompts[k], len(s.token_ids)) for k, s in zip(seen, samples)
                                 if k in self._prompts])
        for k in set(seen):
            self._prompts.pop(k, None)

    def forget(self, step: int) -> None:
        """Drop a logged step's bookkeeping."""
        self.busy.pop(step, None)
        for sid in [s for s in self.instance_of if s[0] == step]:
            del self.instance_of[sid]

    def publish_weights_refs(self, train_leader: object, leader_rank: int, version: int, bucket_mb: float,
                             after: list, owners: dict[int, object] | None = None) -> list:
        """Queue the bucketed broadcast trainer -> every rollout instance over the cached sync group,
        behind `after` (the leader's last update); returns the refs of each side's seconds.
        `owners` (`cluster.shard: full`, train rank -> worker): each sends the parameters it owns."""
        if owners:
            sources = sorted(owners)
            ranks = sources + [inst.device for inst in self.instances]
            refs = [owners[d].sync_weights.remote(leader_rank, ranks, version, bucket_mb,
                                                  requires=after if d == leader_rank else None, sources=sources)
                    for d in sources]
            return refs + [inst.worker.sync_weights.remote(leader_rank, ranks, version, bucket_mb, after,
                                                           sources=sources) for inst in self.instances]
        ranks = [leader_rank] + [inst.device for inst in self.instances]
        # after its update, and only if it succeeded (the receivers wait on it through `after`)
        refs = [train_leader.sync_weights.remote(leader_rank, ranks, version, bucket_mb, requires=after)]
        refs += [inst.worker.sync_weights.remote(leader_rank, ranks, version, bucket_mb, after)
                 for inst in self.instances]
        return refs
