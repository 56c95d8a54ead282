"""Allocator (StreamRL §4.2): the initial rollout/train split and the rollout batch cap.

StreamRL's profiler-based allocator picks the GPU counts so the two stages finish at about the
same time. Ours searches every split (and a set of batch caps per rollout instance) and keeps
the one with the lowest predicted step time for the pipeline mode, priced by the cost model on
a representative step's output lengths. The same `predict_step` prices a candidate split for
the resize controller, so planning and resizing never disagree about what a split costs.

Interface (runtime, simulator, `poise plan`):

    alloc = allocate(cost, StepWorkload(lengths, prompt_len), devices=8, mode="async",
                     devices_per_instance=1, batch_caps=(16, 32, 64))
    alloc.split, alloc.batch_cap, alloc.predicted.step_s, alloc.table   # table: every candidate

With device types (policy/devices.py) `plan_devices` picks a per-type split for a budget:
which type and how many devices each role gets, by throughput per dollar.

Departure from the paper: StreamRL also chooses parallel strategies (TP/PP) per stage; we take
the instance size (`devices_per_instance`) as given and search only counts and batch caps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

from poise.errors import ConfigError
from poise.policy.cost import CostModel, instance_finish_times
from poise.policy.devices import Fleet
from poise.policy.pipeline import PIPELINE_KINDS
from poise.policy.split import Split, all_splits
from poise.policy.turns import EpisodeWork, deal_longest_first, episode_times

PipelineMode = Literal["sync", "stream", "async"]


@dataclass(frozen=True)
class StepWorkload:
    """What one RL step asks for: every sample's output length and the prompt length; for an
    agent job, every sample's episode (its turns, observations and environment seconds) and the
    slot rule (policy/turns.py), which then price generation instead of the lengths."""

    output_lengths: tuple[int, ...]
    prompt_len: int
    episodes: tuple[EpisodeWork, ...] = ()
    slots: str = "refill"

    @property
    def tokens(self) -> int:
        """Tokens the trainer processes: prompt + response of every sample (and observations)."""
        if self.episodes:
            return sum(e.tokens for e in self.episodes)
        return sum(self.output_lengths) + self.prompt_len * len(self.output_lengths)


@dataclass(frozen=True)
class StepPrediction:
    rollout_s: float
    train_s: float
    sync_s: float
    step_s: float


def compose_step(mode: str, rollout_s: float, train_s: float, sync_s: float,
                 stream_train_tail_s: float | None = None) -> float:
    """Steady-state seconds per step from the stage times.

    sync: generate, then train, then publish weights. stream (StreamRL §4.1 dynamic-batch
    pipelining): training overlaps generation and only its tail follows the last sample
    (`stream_train_tail_s`, default: the whole train time — no overlap known). async (one-step
    staleness): generation of step k+1 overlaps training of step k, and the weights of step k-1
    must reach the rollout side before step k+1 starts, so the period is
    max(rollout, train, (rollout + train + sync) / 2).
    """
    if mode == "sync":
        return rollout_s + train_s + sync_s
    if mode == "stream":
        tail = train_s if stream_train_tail_s is None else stream_train_tail_s
        return max(rollout_s + tail, train_s) + sync_s
    if mode == "async":
        return max(rollout_s, train_s, (rollout_s + train_s + sync_s) / 2.0)
    raise ConfigError("pipeline kind", mode, f"allowed: {', '.join(PIPELINE_KINDS)}")


def predict_step(cost: CostModel, work: StepWorkload, split: Split, mode: str,
                 devices_per_instance: int = 1, batch_cap: int = 64,
                 micro_batches: int = 8) -> StepPrediction:
    """Predicted stage and step seconds of `work` on `split` (balanced longest-first dispatch)."""
    instances = split.rollout // devices_per_instance
    if instances < 1 or split.rollout % devices_per_instance:
        raise ConfigError("split", split.as_list(),
                          f"rollout devices must be a positive multiple of devices_per_instance="
                          f"{devices_per_instance}")
    finish = _rollout_finish(cost, work, instances, batch_cap)
    return _predict_from_finish(cost, work, finish, split.train, mode, micro_batches)


def _rollout_finish(cost: CostModel, work: StepWorkload, instances: int, batch_cap: int) -> list[float]:
    """Finish times of the requests of instance 0 of a longest-first deal (the makespan's); with
    episodes, of every episode (their later turns move between instances), environment waits included."""
    if work.episodes:
        queues = deal_longest_first(work.episodes, instances)
        return episode_times(cost, work.episodes, queues, [batch_cap] * instances, 0.0, work.slots).finish
    ordered = sorted(work.output_lengths, reverse=True)[::instances]
    return instance_finish_times(cost, ordered, [work.prompt_len] * len(ordered), batch_cap)


def _predict_from_finish(cost: CostModel, work: StepWorkload, finish: list[float], train_devices: int,
                         mode: str, micro_batches: int, whole_micro_batches: bool = False) -> StepPrediction:
    """`whole_micro_batches`: the busiest train device holds ceil(micro-batches / devices) of
    them (the step plan does not split one), rather than an even share of the tokens."""
    rollout_s = max(finish) if finish else 0.0
    if whole_micro_batches:
        m = max(1, micro_batches)
        train_compute = cost.train_compute_s(work.tokens * math.ceil(m / train_devices) / m, 1)
    else:
        train_compute = cost.train_compute_s(work.tokens, train_devices)
    train_s = train_compute + cost.train_fixed_s(train_devices)
    sync_s = cost.sync_s()
    tail = None
    if mode == "stream" and finish:
        # Micro-batches become ready as the finish-time quantiles pass; the trainer runs them
        # as they come and the last one (plus the optimizer step) follows generation.
        ready = sorted(finish)
        m = max(1, micro_batches)
        t = 0.0
        for j in range(m):
            t = max(t, ready[min(len(ready) - 1, (j + 1) * len(ready) // m - 1)]) + train_compute / m
        tail = max(0.0, t - rollout_s) + cost.train_fixed_s(train_devices)
    step_s = compose_step(mode, rollout_s, train_s, sync_s, tail)
    return StepPrediction(rollout_s, train_s, sync_s, step_s)


@dataclass(frozen=True)
class Allocation:
    split: Split
    batch_cap: int
    predicted: StepPrediction
    table: tuple[tuple[Split, int, StepPrediction], ...]  # every candidate, for `poise plan`


def allocate(cost: CostModel, work: StepWorkload | Sequence[StepWorkload], devices: int, mode: str,
             devices_per_instance: int = 1, batch_caps: Sequence[int] = (64,),
             allowed: Sequence[Split] | None = None, micro_batches: int = 8,
             tolerance: float = 0.03) -> Allocation:
    """The split and batch cap with the lowest predicted step time, averaged over the given
    representative steps (one step's longest sample is noisy; pass a few).

    Among candidates within `tolerance` of the best, the one with the most slack wins: the
    lowest rollout + train seconds, i.e. the non-bottleneck stage has the most headroom, which
    absorbs step-to-step variance in a pipeline (a perfectly balanced async pipeline stalls on
    every noisy step). Remaining ties: fewer rollout devices, then the smaller batch cap, which
    leaves more KV-cache memory free."""
    works = [work] if isinstance(work, StepWorkload) else list(work)
    if not works:
        raise ConfigError("workload", [], "give at least one representative step")
    if not batch_caps or any(c < 1 for c in batch_caps):
        raise ConfigError("batch_caps", list(batch_caps), "give at least one cap >= 1, e.g. [32, 64]")
    candidates = list(allowed) if allowed else all_splits(devices, devices_per_instance)
    table = []
    for split in candidates:
        if split.devices != devices:
            raise ConfigError("allowed_splits", split.as_list(),
                              f"uses {split.devices} devices but the pool has {devices}")
        for cap in sorted(set(batch_caps)):
            preds = [predict_step(cost, w, split, mode, devices_per_instance, cap, micro_batches)
                     for w in works]
            n = len(preds)
            table.append((split, cap, StepPrediction(sum(p.rollout_s for p in preds) / n,
                                                     sum(p.train_s for p in preds) / n,
                                                     preds[0].sync_s,
                                                     sum(p.step_s for p in preds) / n)))
    best_s = min(row[2].step_s for row in table)
    near = [row for row in table if row[2].step_s <= best_s * (1.0 + tolerance)]
    best = min(near, key=lambda row: (round(row[2].rollout_s + row[2].train_s, 6), row[0].rollout, row[1]))
    return Allocation(best[0], best[1], best[2], tuple(table))


# --- device types (StreamRL §7.3: generation and training on different GPUs) ------------------

# Training holds bf16 weights and gradients plus fp32 master weights and Adam moments: 16 bytes
# per parameter, 8x the bf16 weights a sync moves, sharded over the train devices (ZeRO-3/FSDP).
# Activations are not counted: a feasibility floor, not a memory planner.
TRAIN_STATE_PER_WEIGHT_BYTE = 8.0


@dataclass(frozen=True)
class DeviceSplit:
    """A per-type split: the device type and count of each role, priced."""

    rollout_type: str
    train_type: str
    split: Split
    batch_cap: int
    predicted: StepPrediction
    price_per_hour: float  # USD for the devices of both roles
    tokens_per_s: float  # generated tokens per second at the predicted step time

    @property
    def tokens_per_dollar(self) -> float:
        return self.tokens_per_s * 3600.0 / self.price_per_hour

    def __str__(self) -> str:
        return f"{self.split.rollout} {self.rollout_type} rollout + {self.split.train} {self.train_type} train"


@dataclass(frozen=True)
class DevicePlan:
    best: DeviceSplit
    single_type: dict[str, DeviceSplit]  # per type: the best split that uses that type alone
    budget_per_hour: float
    table: tuple[DeviceSplit, ...]  # every feasible candidate

    @property
    def best_single_type(self) -> DeviceSplit | None:
        """The single-type split with the most throughput per dollar (the homogeneous baseline)."""
        return max(self.single_type.values(), key=lambda d: d.tokens_per_dollar, default=None)


def plan_devices(cost: CostModel, fleet: Fleet, work: StepWorkload | Sequence[StepWorkload], mode: str,
                 budget_per_hour: float | None = None, devices_per_instance: int = 1,
                 batch_caps: Sequence[int] = (64,), micro_batches: int = 8, tolerance: float = 0.03) -> DevicePlan:
    """The per-type split (rollout type and count, train type and count, batch cap) for a budget.

    Every role runs on one type (a rollout instance's devices, and a data-parallel train group,
    go as fast as their slowest member; StreamRL likewise puts each stage on one GPU type).
    Candidates must fit the types' counts, cost at most `budget_per_hour` (default: every listed
    device), hold the model (a rollout instance its weights, the train group the sharded
    training state) and have no more train devices than micro-batches. Each is priced as
    `predict_step` prices a split, with its roles on their types (`Fleet.place`) and the busiest
    train device holding whole micro-batches.

    The choice: among candidates within `tolerance` of the most throughput the budget buys, the
    most generated tokens per dollar, so a device that adds no speed is not bought. (Tokens per
    dollar alone would pick the smallest job: it idles least on the long tail.) `single_type`
    applies the same rule to each type alone: the homogeneous baselines of the same budget.
    """
    works = [work] if isinstance(work, StepWorkload) else list(work)
    if not works:
        raise ConfigError("workload", [], "give at least one representative step")
    if not batch_caps or any(c < 1 for c in batch_caps):
        raise ConfigError("batch_caps", list(batch_caps), "give at least one cap >= 1, e.g. [32, 64]")
    budget = budget_per_hour if budget_per_hour is not None else \
        fleet.price_per_hour({name: t.count for name, t in fleet.types.items()})
    weights = cost.cfg.weight_bytes
    tokens = sum(sum(w.output_lengths) for w in works) / len(works)
    finish: dict[tuple[str, int, int, int], list[float]] = {}  # rollout depends on its type alone
    rows = []
    for a, ta in fleet.types.items():
        if weights / devices_per_instance > ta.memory_gb * 1e9:  # type: ignore[operator]
            continue
        for b, tb in fleet.types.items():
            placed = fleet.place(cost, a, b)
            for n_r in range(devices_per_instance, ta.count + 1, devices_per_instance):
                for n_t in range(1, min(tb.count, max(1, micro_batches)) + 1):  # more would idle
                    price = fleet.split_price(a, n_r, b, n_t)
                    if not fleet.fits(a, n_r, b, n_t) or price > budget * (1 + 1e-9):
                        break  # more train devices only cost more
                    if TRAIN_STATE_PER_WEIGHT_BYTE * weights / n_t > tb.memory_gb * 1e9:  # type: ignore[operator]
                        continue
                    for cap in sorted(set(batch_caps)):
                        preds = []
                        for i, w in enumerate(works):
                            key = (a, n_r // devices_per_instance, cap, i)
                            if key not in finish:
                                finish[key] = _rollout_finish(placed, w, n_r // devices_per_instance, cap)
                            preds.append(_predict_from_finish(placed, w, finish[key], n_t, mode, micro_batches,
                                                              whole_micro_batches=True))
                        n = len(preds)
                        pred = StepPrediction(sum(p.rollout_s for p in preds) / n, sum(p.train_s for p in preds) / n,
                                              preds[0].sync_s, sum(p.step_s for p in preds) / n)
                        rows.append(DeviceSplit(a, b, Split(n_r, n_t), cap, pred, price,
                                                tokens / pred.step_s if pred.step_s > 0 else 0.0))
    if not rows:
        raise ConfigError("cluster.budget_per_hour", budget,
                          "buys no split that holds the model (one rollout instance and a train group of each "
                          "role's type): raise the budget or list more or larger devices")
    single = {}
    for name in fleet.types:
        own = [r for r in rows if r.rollout_type == r.train_type == name]
        if own:
            single[name] = _cheapest_near_fastest(own, tolerance)
    return DevicePlan(_cheapest_near_fastest(rows, tolerance), single, budget, tuple(rows))


def _cheapest_near_fastest(rows: Sequence[DeviceSplit], tolerance: float) -> DeviceSplit:
    top = max(r.tokens_per_s for r in rows)
    near = [r for r in rows if r.tokens_per_s >= top * (1.0 - tolerance)]
    return max(near, key=lambda r: (r.tokens_per_dollar, -r.split.devices, -r.batch_cap))
