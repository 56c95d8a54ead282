"""Data-parallel trainer over the train devices, fed sample by sample (dynamic-batch pipelining).

The step's sample ids are known in advance (`StepLedger`): a duplicate or unknown id fails at
once, a missing one fails when generation ends (DESIGN.md invariant 5). Canonical micro-batches
are cut from the sample-id order, never arrival order; micro-batch j of a mini-batch with M of
them goes to train device d when j is in d's contiguous range [d*M//T, (d+1)*M//T). A micro-batch
starts as soon as its samples and their prompt groups (for GRPO advantages) are all in — with
`streaming: false` nothing starts before the whole batch is in. Each mini-batch ends with one
reduction and one optimizer step on every train device (Ray runs an actor's calls in the order
one caller sent them, so a device never trains mini-batch u+1 before it applied update u).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import ray
import torch

from poise.algo.losses import group_advantages
from poise.errors import PoiseError

SampleId = tuple[int, int, int]


class SampleSetError(PoiseError):
    """The samples that reached the trainer are not exactly the step's expected set."""


class StepLedger:
    """The exact set of sample ids a step needs; every arrival is checked against it."""

    def __init__(self, step: int, prompts: int, group_size: int):
        self.step = step
        self.expected = [(step, i, j) for i in range(prompts) for j in range(group_size)]
        self._expected = set(self.expected)
        self.arrived: dict[SampleId, object] = {}

    def add(self, sample) -> None:
        sid = tuple(sample.sample_id)
        if sid not in self._expected:
            raise SampleSetError(f"step {self.step}: sample {sid} does not belong to this step "
                                 f"(expected ids ({self.step}, 0..{self.expected[-1][1]}, 0..{self.expected[-1][2]}))")
        if sid in self.arrived:
            raise SampleSetError(f"step {self.step}: sample {sid} arrived twice; a rollout instance or the "
                                 "dispatcher duplicated it")
        self.arrived[sid] = sample

    def check_complete(self) -> None:
        missing = [sid for sid in self.expected if sid not in self.arrived]
        if missing:
            shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
            raise SampleSetError(f"step {self.step}: {len(missing)} of {len(self.expected)} samples never arrived "
                                 f"({shown}); a rollout instance or the dispatcher lost them")

    @property
    def complete(self) -> bool:
        return len(self.arrived) == len(self.expected)


def contiguous_ranges(num_micro_batches: int, devices: int) -> list[tuple[int, int]]:
    return [(d * num_micro_batches // devices, (d + 1) * num_micro_batches // devices) for d in range(devices)]


@dataclass
class _MiniBatch:
    ids: list[SampleId]  # sorted
    micro: list[list[SampleId]]
    dispatched: set[int] = field(default_factory=set)
    closed: bool = False


class TrainerGroup:
    def __init__(self, workers: Sequence[object], ranks: Sequence[int], micro_batch_size: int, updates_per_step: int,
                 group_size: int, scale_rewards: bool, streaming: bool, loss_agg: str):
        self.workers, self.ranks = list(workers), list(ranks)
        self.loss_agg = loss_agg
        self.micro_batch_size, self.updates = micro_batch_size, updates_per_step
        self.group_size, self.scale_rewards, self.streaming = group_size, scale_rewards, streaming

    def start_step(self, step: int, prompts: int) -> StepLedger:
        self.ledger = StepLedger(step, prompts, self.group_size)
        self.rewards: dict[SampleId, float] = {}
        self.advantages: dict[SampleId, float] = {}
        per_update = len(self.ledger.expected) // self.updates
        self.minis = []
        for u in range(self.updates):
            ids = self.ledger.expected[u * per_update:(u + 1) * per_update]
            micro = [ids[i:i + self.micro_batch_size] for i in range(0, len(ids), self.micro_batch_size)]
            self.minis.append(_MiniBatch(ids, micro))
        self.next_mini = 0
        self.micro_refs: list = []
        self.update_refs: list = []
        return self.ledger

    def feed(self, sample, reward: float) -> None:
        """Accept one finished sample; start every micro-batch that became ready."""
        self.ledger.add(sample)
        sid = tuple(sample.sample_id)
        self.rewards[sid] = reward
        group = [(sid[0], sid[1], j) for j in range(self.group_size)]
        if all(g in self.rewards for g in group):
            adv = group_advantages(torch.tensor([[self.rewards[g] for g in group]], dtype=torch.float32),
                                   scale=self.scale_rewards)[0]
            for g, a in zip(group, adv.tolist()):
                self.advantages[g] = a
        if self.streaming or self.ledger.complete:
            self._dispatch_ready()

    def _dispatch_ready(self) -> None:
        while self.next_mini < len(self.minis):
            mini = self.minis[self.next_mini]
            ranges = contiguous_ranges(len(mini.micro), len(self.workers))
            for j, ids in enumerate(mini.micro):
                if j in mini.dispatched or not all(i in self.advantages for i in ids):
                    continue
                owner = next(d for d, (lo, hi) in enumerate(ranges) if lo <= j < hi)
                samples = [self.ledger.arrived[i] for i in ids]
                self.micro_refs.append(self.workers[owner].train_micro_batch.remote(
                    j, samples, [self.advantages[i] for i in ids]))
                mini.dispatched.add(j)
            if len(mini.dispatched) < len(mini.micro):
                return
            # every micro-batch of this mini-batch is queued: queue its update on every device
            normaliser = self._normaliser(mini)
            self.update_refs.append([w.apply_update.remote(len(mini.micro), lo, hi, normaliser, self.ranks)
                                     for w, (lo, hi) in zip(self.workers, ranges)])
            mini.closed = True
            self.next_mini += 1

    def _normaliser(self, mini: _MiniBatch) -> float:
        # the same sum, in the same order, as the colocated trainer's
        samples = [self.ledger.arrived[i] for i in mini.ids]
        if self.loss_agg == "token":
            per_micro = [float(sum(len(s.token_ids) for s in samples[k:k + self.micro_batch_size]))
                         for k in range(0, len(samples), self.micro_batch_size)]
        else:
            per_micro = [float(len(samples[k:k + self.micro_batch_size]))
                         for k in range(0, len(samples), self.micro_batch_size)]
        return sum(per_micro)

    def finish_step(self) -> dict:
        """Wait for every micro-batch and update of the step; returns the step's training stats."""
        self.ledger.check_complete()
        self._dispatch_ready()
        micro = ray.get(self.micro_refs)
        updates = [ray.get(refs) for refs in self.update_refs]
        tokens = max(1, sum(m["tokens"] for m in micro))
        normaliser = sum(m["normaliser"] for m in micro)
        return {
            "loss": sum(m["loss_sum"] for m in micro) / max(1e-12, normaliser),
            "grad_norm": sum(u[0]["grad_norm"] for u in updates) / len(updates),
            "clip_frac": sum(m["clipped"] for m in micro) / tokens,
            "kl": sum(m["kl_sum"] for m in micro) / tokens,
            "micro_batches": micro,
            "updates": updates,
        }
