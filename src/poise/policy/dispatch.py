"""Dispatch: which rollout instance gets which request, in which order, under which batch cap.

Interface (the stream generation service of the runtime, the simulator):

    plan = dispatcher.plan(prompts, instances)      # prompts: Sequence[rankers.Prompt]
    for request_index, instance_id in plan.order:   # submit in this order
        submit(request_index, instance_id)
    plan.batch_caps[instance_id]                    # live-batch cap each instance uses now
    plan.tail_instances                             # the instances reserved for the long tail

Policies:
  round_robin   request i to instance (offset + i) mod n; offset carries over between steps
  random        uniform instance per request (a `random.Random` passed in)
  least_loaded  greedy: each request to the instance with the least outstanding predicted
                tokens (request count when there is no ranker)
  skew_aware    StreamRL §5.3: the ranker's predicted longest `long_tail_fraction` go to a
                dedicated group of instances with a small batch cap (low per-token latency for
                the sequences that set the makespan); both groups are filled
                longest-processing-time first (LPT, Graham's 4/3 bound), and each instance
                receives its requests longest first. The size of the tail group is the one
                whose predicted makespan (cost-model continuous batching) is lowest, our
                stand-in for the paper's P50/P90 estimate in Algorithm 2.

All policies are pure: no clock, no I/O; time-independent because every request of a step is
known when it is dispatched (GRPO submits the whole step at once).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from poise.errors import ConfigError
from poise.policy.cost import CostModel, instance_finish_times
from poise.policy.rankers import LengthRanker, Prompt


@dataclass(frozen=True)
class InstanceInfo:
    instance_id: int
    batch_cap: int
    outstanding_tokens: float = 0.0  # predicted tokens still queued or live on it


@dataclass(frozen=True)
class DispatchPlan:
    order: tuple[tuple[int, int], ...]  # (request index, instance id), in submission order
    batch_caps: dict[int, int]
    tail_instances: tuple[int, ...] = ()
    reason: str = ""
    predicted_lengths: tuple[float, ...] = field(default=())


class Dispatcher(Protocol):
    name: str

    def plan(self, prompts: Sequence[Prompt], instances: Sequence[InstanceInfo]) -> DispatchPlan: ...


def _check_instances(instances: Sequence[InstanceInfo]) -> None:
    if not instances:
        raise ConfigError("rollout instances", 0, "need at least one rollout instance to dispatch to")


class RoundRobinDispatcher:
    name = "round_robin"

    def __init__(self) -> None:
        self._offset = 0

    def plan(self, prompts: Sequence[Prompt], instances: Sequence[InstanceInfo]) -> DispatchPlan:
        _check_instances(instances)
        n = len(instances)
        order = tuple((i, instances[(self._offset + i) % n].instance_id) for i in range(len(prompts)))
        self._offset = (self._offset + len(prompts)) % n
        return DispatchPlan(order, {x.instance_id: x.batch_cap for x in instances}, (), "round robin")


class RandomDispatcher:
    name = "random"

    def __init__(self, rng: random.Random):
        self._rng = rng

    def plan(self, prompts: Sequence[Prompt], instances: Sequence[InstanceInfo]) -> DispatchPlan:
        _check_instances(instances)
        ids = [x.instance_id for x in instances]
        order = tuple((i, self._rng.choice(ids)) for i in range(len(prompts)))
        return DispatchPlan(order, {x.instance_id: x.batch_cap for x in instances}, (), "random")


class LeastLoadedDispatcher:
    name = "least_loaded"

    def __init__(self, ranker: LengthRanker | None = None):
        self.ranker = ranker

    def plan(self, prompts: Sequence[Prompt], instances: Sequence[InstanceInfo]) -> DispatchPlan:
        _check_instances(instances)
        pred = self.ranker.scores(prompts) if self.ranker else [1.0] * len(prompts)
        heap = [(x.outstanding_tokens, k, x.instance_id) for k, x in enumerate(instances)]
        heapq.heapify(heap)
        order = []
        for i, p in enumerate(pred):
            load, k, iid = heapq.heappop(heap)
            order.append((i, iid))
            heapq.heappush(heap, (load + max(p, 1e-9), k, iid))
        return DispatchPlan(tuple(order), {x.instance_id: x.batch_cap for x in instances}, (),
                            "least loaded", tuple(pred))


def lpt_assign(lengths: Sequence[float], items: Sequence[int], bins: Sequence[int]) -> dict[int, list[int]]:
    """Longest-processing-time-first: items (indices into `lengths`) longest first, each to the
    bin with the least assigned length. Returns bin -> items, each list longest first."""
    out: dict[int, list[int]] = {b: [] for b in bins}
    heap = [(0.0, k, b) for k, b in enumerate(bins)]
    heapq.heapify(heap)
    for i in sorted(items, key=lambda i: (-lengths[i], i)):
        load, k, b = heapq.heappop(heap)
        out[b].append(i)
        heapq.heappush(heap, (load + lengths[i], k, b))
    return out


class SkewAwareDispatcher:
    """StreamRL §5.3 skewness-aware dispatch; see the module docstring."""

    name = "skew_aware"

    def __init__(self, ranker: LengthRanker, cost: CostModel, prompt_len: int,
                 long_tail_fraction: float = 0.2, tail_batch_cap: int = 8,
                 tail_instances: int | None = None):
        if not 0.0 < long_tail_fraction < 1.0:
            raise ConfigError("dispatch.long_tail_fraction", long_tail_fraction,
                              "must be between 0 and 1 (StreamRL uses 0.2)")
        if tail_batch_cap < 1:
            raise ConfigError("dispatch.tail_batch_cap", tail_batch_cap, "must be >= 1 slot")
        self.ranker, self.cost, self.prompt_len = ranker, cost, prompt_len
        self.fraction, self.tail_cap, self.tail_instances = long_tail_fraction, tail_batch_cap, tail_instances

    def _makespan(self, pred: Sequence[float], groups: dict[int, list[int]], cap: int) -> float:
        worst = 0.0
        for items in groups.values():
            if items:
                lens = [max(1, int(pred[i])) for i in items]
                worst = max(worst, max(instance_finish_times(self.cost, lens, [self.prompt_len] * len(lens), cap)))
        return worst

    def plan(self, prompts: Sequence[Prompt], instances: Sequence[InstanceInfo]) -> DispatchPlan:
        _check_instances(instances)
        pred = self.ranker.scores(prompts)
        ids = [x.instance_id for x in instances]
        caps = {x.instance_id: x.batch_cap for x in instances}
        n = len(ids)
        ranked = sorted(range(len(prompts)), key=lambda i: (-pred[i], i))
        n_tail_req = int(round(self.fraction * len(prompts)))
        if n < 2 or n_tail_req == 0 or max(pred, default=0.0) <= 0.0:
            groups = lpt_assign(pred, ranked, ids)
            return DispatchPlan(_interleave(groups, ids), caps, (), "LPT, no tail group", tuple(pred))
        tail_req, regular_req = ranked[:n_tail_req], ranked[n_tail_req:]
        reg_cap = min(caps.values())
        if self.tail_instances is not None:
            options = [min(max(1, self.tail_instances), n - 1)]
        else:
            options = sorted({k for k in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128,
                                          n // 8, n // 4, n // 2) if 1 <= k <= n - 1})
        best = None
        for k in options:
            tail_ids, reg_ids = ids[:k], ids[k:]
            tail_groups = lpt_assign(pred, tail_req, tail_ids)
            reg_groups = lpt_assign(pred, regular_req, reg_ids)
            span = max(self._makespan(pred, tail_groups, self.tail_cap),
                       self._makespan(pred, reg_groups, reg_cap))
            if best is None or span < best[0] - 1e-9:
                best = (span, k, tail_groups, reg_groups)
        assert best is not None
        _, k, tail_groups, reg_groups = best
        for b in ids[:k]:
            caps[b] = min(caps[b], self.tail_cap)
        groups = {**tail_groups, **reg_groups}
        return DispatchPlan(_interleave(groups, ids), caps, tuple(ids[:k]),
                            f"{n_tail_req} predicted long-tail requests on {k} of {n} instances "
                            f"(batch cap {self.tail_cap}), LPT", tuple(pred))


def _interleave(groups: dict[int, list[int]], ids: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """Submission order: each instance's own list stays longest first; across instances the
    k-th request of every instance goes before any (k+1)-th, so all instances start at once."""
    order = []
    depth = max((len(v) for v in groups.values()), default=0)
    for k in range(depth):
        for b in ids:
            if k < len(groups[b]):
                order.append((groups[b][k], b))
    return tuple(order)


def make_dispatcher(policy: str, rng: random.Random, ranker: LengthRanker | None, cost: CostModel,
                    prompt_len: int, long_tail_fraction: float = 0.2, tail_batch_cap: int = 8,
                    tail_instances: int | None = None) -> Dispatcher:
    if policy == "round_robin":
        return RoundRobinDispatcher()
    if policy == "random":
        return RandomDispatcher(rng)
    if policy == "least_loaded":
        return LeastLoadedDispatcher(ranker)
    if policy == "skew_aware":
        if ranker is None:
            raise ConfigError("dispatch.ranker", None, "skew_aware dispatch needs a ranker: "
                              "oracle, random, history or learned")
        return SkewAwareDispatcher(ranker, cost, prompt_len, long_tail_fraction, tail_batch_cap,
                                   tail_instances)
    raise ConfigError("dispatch.policy", policy,
                      "allowed: 'round_robin', 'random', 'least_loaded', 'skew_aware'")
