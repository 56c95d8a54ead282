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

Departure from the paper: StreamRL also chooses parallel strategies (TP/PP) per stage; we take
the instance size (`devices_per_instance`) as given and search only counts and batch caps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from poise.errors import ConfigError
from poise.policy.cost import CostModel, instance_finish_times
from poise.policy.pipeline import PIPELINE_KINDS
from poise.policy.split import Split, all_splits

PipelineMode = Literal["sync", "stream", "async"]


@dataclass(frozen=True)
class StepWorkload:
    """What one RL step asks for: every sample's output length and the prompt length."""

    output_lengths: tuple[int, ...]
    prompt_len: int

    @property
    def tokens(self) -> int:
        """Tokens the trainer processes: prompt + response of every sample."""
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
    lengths = work.output_lengths
    ordered = sorted(lengths, reverse=True)[::instances]  # instance 0 of a longest-first deal
    finish = instance_finish_times(cost, ordered, [work.prompt_len] * len(ordered), batch_cap)
    rollout_s = max(finish) if finish else 0.0
    train_compute = cost.train_compute_s(work.tokens, split.train)
    train_s = train_compute + cost.train_fixed_s(split.train)
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
        tail = max(0.0, t - rollout_s) + cost.train_fixed_s(split.train)
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
