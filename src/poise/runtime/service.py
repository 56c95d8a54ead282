"""Stream generation service (StreamRL §3): rollout instances fed by the policy dispatcher, each
finished sample handed on at once.

Per step, the dispatcher (`poise.policy.dispatch`) plans which instance serves which prompt and
in what order, and each instance's live-batch cap. The service keeps at most `cap` requests in
flight per instance, topping up as samples finish, and yields every sample the moment its
instance's `poll` returns it. All G samples of a prompt go to one instance.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import ray

from poise.data.tasks import Problem
from poise.policy.dispatch import Dispatcher, DispatchPlan, InstanceInfo
from poise.policy.rankers import Finished, LengthRanker, Prompt
from poise.rollout.engine import Request, Sample


@dataclass
class _Instance:
    worker: object  # DeviceWorker handle
    device: int
    cap: int
    pending: deque = field(default_factory=deque)
    in_flight: int = 0
    poll_ref: object | None = None
    busy_start: float | None = None
    busy_end: float | None = None


class StreamGenerationService:
    def __init__(self, workers: Sequence[object], devices: Sequence[int], dispatcher: Dispatcher,
                 ranker: LengthRanker | None, group_size: int, num_slots: int, poll_seconds: float = 0.02):
        self.instances = [_Instance(w, d, num_slots) for w, d in zip(workers, devices)]
        self.dispatcher, self.ranker = dispatcher, ranker
        self.group_size, self.num_slots, self.poll_seconds = group_size, num_slots, poll_seconds
        self.last_plan: DispatchPlan | None = None
        self._prompts: dict[int, Prompt] = {}

    def start_step(self, step: int, problems: Sequence[Problem], prompt_ids: Sequence[list[int]]) -> DispatchPlan:
        """Plan the step's prompts over the instances and submit up to each instance's cap."""
        prompts = [Prompt(p.uid, p.prompt) for p in problems]
        infos = [InstanceInfo(i, self.num_slots) for i in range(len(self.instances))]
        plan = self.dispatcher.plan(prompts, infos)
        self.last_plan = plan
        for i, inst in enumerate(self.instances):
            inst.cap = max(1, min(self.num_slots, plan.batch_caps.get(i, self.num_slots)))
            inst.busy_start = inst.busy_end = None
        for prompt_index, instance_id in plan.order:
            self._prompts[prompt_index] = prompts[prompt_index]
            for j in range(self.group_size):
                self.instances[instance_id].pending.append(Request((step, prompt_index, j), prompt_ids[prompt_index]))
        for inst in self.instances:
            self._top_up(inst)
        return plan

    def _top_up(self, inst: _Instance) -> None:
        room = inst.cap - inst.in_flight
        batch = [inst.pending.popleft() for _ in range(min(room, len(inst.pending)))]
        if batch:
            ray.get(inst.worker.submit.remote(batch))
            inst.in_flight += len(batch)
        if inst.in_flight and inst.poll_ref is None:
            inst.poll_ref = inst.worker.poll.remote(self.poll_seconds)

    def stream(self) -> Iterator[tuple[Sample, int]]:
        """Yield (sample, device) for every finished sample of the step, as soon as it finishes."""
        while True:
            refs = {inst.poll_ref: inst for inst in self.instances if inst.poll_ref is not None}
            if not refs:
                return
            ready, _ = ray.wait(list(refs), num_returns=1)
            inst = refs[ready[0]]
            inst.poll_ref = None
            finished, still, start, end = ray.get(ready[0])
            inst.busy_start = start if inst.busy_start is None else inst.busy_start
            inst.busy_end = end
            inst.in_flight = still
            self._top_up(inst)
            for sample in finished:
                yield sample, inst.device

    def observe(self, samples: Sequence[Sample]) -> None:
        """Feed finished lengths to the ranker (the history/learned rankers learn from them)."""
        if self.ranker is None:
            return
        self.ranker.observe([Finished(self._prompts[s.sample_id[1]], len(s.token_ids)) for s in samples
                             if s.sample_id[1] in self._prompts])
        self._prompts.clear()

    def publish_weights(self, train_leader: object, leader_rank: int, version: int, bucket_mb: float) -> float:
        """Bucketed broadcast trainer -> every rollout instance over the cached sync group."""
        ranks = [leader_rank] + [inst.device for inst in self.instances]
        refs = [train_leader.sync_weights.remote(leader_rank, ranks, version, bucket_mb)]
        refs += [inst.worker.sync_weights.remote(leader_rank, ranks, version, bucket_mb) for inst in self.instances]
        return max(ray.get(refs))


def make_ranker_and_dispatcher(policy: str, ranker_name: str, seed: int, long_tail_fraction: float,
                               tail_batch_cap: int, prompt_len: int):
    from poise.policy.cost import CostModel
    from poise.policy.dispatch import make_dispatcher
    from poise.policy.rankers import make_ranker

    rng = random.Random(seed)
    ranker = make_ranker(ranker_name, rng) if policy in ("skew_aware", "least_loaded") else None
    dispatcher = make_dispatcher(policy, rng, ranker, CostModel(), prompt_len, long_tail_fraction, tail_batch_cap)
    return ranker, dispatcher
