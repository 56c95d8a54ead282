"""Dispatch: which rollout instance gets which prompt group, in which order, under which batch cap.

The unit is a prompt group: all G samples of a prompt go to one instance, one after another
(GRPO needs whole groups, and they share the prompt's prefill). The runtime's stream generation
service, the emulation and the simulator build the ranker and the dispatcher with one call:

    ranker, dispatcher = build_dispatch(DispatchConfig(...), seed, cost, prompt_len, group_size)
    plan = dispatcher.plan(prompts, instances)      # prompts: Sequence[rankers.Prompt], one per group
    for prompt_index, instance_id in plan.order:    # submit in this order
        for j in range(group_size): submit((step, prompt_index, j), instance_id)
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
                stand-in for the paper's P50/P90 estimate in Algorithm 2; plain LPT over all
                instances (no tail group) is one of the candidates, so a pool too small for a
                tail group is never made worse by one.

All policies are pure: no clock, no I/O; time-independent because every request of a step is
known when it is dispatched (GRPO submits the whole step at once).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

from poise.config.policy import DispatchConfig
from poise.errors import ConfigError
from poise.policy.cost import CostModel, instance_finish_times
from poise.policy.rankers import LengthRanker, Prompt, make_ranker
from poise.policy.seeds import stable_seed




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
        heapq.heappush(heap, (load + max(lengths[i], 1.0), k, b))  # no info: balance counts
    return out


class SkewAwareDispatcher:
    """StreamRL §5.3 skewness-aware dispatch; see the module docstring."""

    name = "skew_aware"

    def __init__(self, ranker: LengthRanker, cost: CostModel, prompt_len: int,
                 long_tail_fraction: float = 0.2, tail_batch_cap: int = 8,
                 tail_instances: int | None = None, group_size: int = 1):
        if not 0.0 < long_tail_fraction < 1.0:
            raise ConfigError("dispatch.long_tail_fraction", long_tail_fraction,
                              "must be between 0 and 1 (StreamRL uses 0.2)")
        if tail_batch_cap < 1:
            raise ConfigError("dispatch.tail_batch_cap", tail_batch_cap, "must be >= 1 slot")
        self.ranker, self.cost, self.prompt_len = ranker, cost, prompt_len
        self.fraction, self.tail_cap, self.tail_instances = long_tail_fraction, tail_batch_cap, tail_instances
        self.group_size = group_size  # requests per prompt: an instance runs all of them

    def _makespan(self, pred: Sequence[float], plens: Sequence[int], groups: dict[int, list[int]],
                  cap: int) -> float:
        worst = 0.0
        g = self.group_size
        for items in groups.values():
            if items:
                lens = [max(1, int(pred[i])) for i in items for _ in range(g)]
                prompt_lens = [plens[i] for i in items for _ in range(g)]
                worst = max(worst, max(instance_finish_times(self.cost, lens, prompt_lens, cap)))
        return worst

    def plan(self, prompts: Sequence[Prompt], instances: Sequence[InstanceInfo]) -> DispatchPlan:
        _check_instances(instances)
        pred = self.ranker.scores(prompts)
        plens = [p.tokens or self.prompt_len for p in prompts]
        ids = [x.instance_id for x in instances]
        caps = {x.instance_id: x.batch_cap for x in instances}
        n = len(ids)
        ranked = sorted(range(len(prompts)), key=lambda i: (-pred[i], i))
        reg_cap = min(caps.values())
        # Candidate plans: LPT over all instances (no tail group), and a tail group of k
        # instances for the predicted longest `fraction` (and half of it, for small pools).
        # The one with the lowest predicted makespan wins.
        # A fixed `tail_instances` always gets its tail group; otherwise "no tail group" competes.
        options: list[tuple[int, int]] = [] if self.tail_instances is not None and n >= 2 else [(0, 0)]
        if n >= 2 and max(pred, default=0.0) > 0.0:
            ks = [self.tail_instances] if self.tail_instances is not None else \
                sorted({k for k in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, n // 8,
                                    n // 4, n // 2) if 1 <= k <= n - 1})
            # With a fixed tail group only the configured fraction is tried (one candidate, so
            # no makespan needs pricing: the large-pool fast path).
            fracs = (self.fraction,) if self.tail_instances is not None else (self.fraction, self.fraction / 2)
            for frac in fracs:
                n_tail = int(round(frac * len(prompts)))
                if n_tail:
                    options += [(min(max(1, k), n - 1), n_tail) for k in ks]
        options = options or [(0, 0)]
        best = None
        for k, n_tail in options:
            tail_groups = lpt_assign(pred, ranked[:n_tail], ids[:k]) if k else {}
            reg_groups = lpt_assign(pred, ranked[n_tail:], ids[k:])
            if len(options) == 1:
                best = (0.0, k, n_tail, tail_groups, reg_groups)
                break
            span = max(self._makespan(pred, plens, tail_groups, self.tail_cap) if k else 0.0,
                       self._makespan(pred, plens, reg_groups, reg_cap))
            if best is None or span < best[0] - 1e-9:
                best = (span, k, n_tail, tail_groups, reg_groups)
        assert best is not None
        _, k, n_tail, tail_groups, reg_groups = best
        for b in ids[:k]:
            caps[b] = min(caps[b], self.tail_cap)
        groups = {**tail_groups, **reg_groups}
        reason = (f"{n_tail} predicted long-tail requests on {k} of {n} instances (batch cap "
                  f"{self.tail_cap}), LPT" if k else f"LPT over {n} instances, no tail group")
        return DispatchPlan(_interleave(groups, ids), caps, tuple(ids[:k]), reason, tuple(pred))


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
                    tail_instances: int | None = None, group_size: int = 1) -> Dispatcher:
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
                                   tail_instances, group_size)
    raise ConfigError("dispatch.policy", policy,
                      "allowed: 'round_robin', 'random', 'least_loaded', 'skew_aware'")


def build_dispatch(cfg: DispatchConfig, seed: int, cost: CostModel, prompt_len: int, group_size: int = 1,
                   oracle: Callable[[Prompt], float] | None = None,
                   rankers: Mapping[str, Callable[[random.Random], LengthRanker]] | None = None,
                   ) -> tuple[LengthRanker, Dispatcher]:
    """The ranker and the dispatcher of `cfg`: the one construction the runtime, the emulation
    and the simulator share. `cost` prices the skew-aware tail group, `prompt_len` stands in for a
    prompt whose `tokens` is 0, `group_size` is the requests each prompt brings, `oracle` gives
    true lengths (only where they are known in advance), `rankers` adds rankers that need torch
    (`poise.model.length_ranker.torch_rankers()`: only a real-compute job passes it). Each draws
    from its own sub-seed of `seed`."""
    ranker = make_ranker(cfg.ranker, random.Random(stable_seed("ranker", seed)), oracle, rankers)
    dispatcher = make_dispatcher(cfg.policy, random.Random(stable_seed("dispatch", seed)), ranker, cost, prompt_len,
                                 cfg.long_tail_fraction, cfg.tail_batch_cap, cfg.tail_instances, group_size)
    return ranker, dispatcher
