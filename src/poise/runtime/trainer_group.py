"""Data-parallel trainer over the train devices, fed as samples arrive (dynamic-batch pipelining).

Everything about what a step trains on comes from its `StepPlan` (poise.policy.plan): the exact
set of sample ids (a duplicate or unknown id fails at once, a missing one when generation ends:
docs/design.md invariant 5), the mini-batches, the canonical micro-batches and which train device owns
each. A micro-batch starts as soon as its samples and their prompt groups (for GRPO advantages)
are all in — with `streaming: false` nothing starts before the whole batch is in. Each mini-batch
ends with one reduction and one optimizer step on every train device (Ray runs an actor's calls in
the order one caller sent them, so a device never trains mini-batch u+1 before it applied update u).
"""

from __future__ import annotations

from typing import Sequence

import ray

from poise.algo.advantages import STD_EPS, ready_advantages
from poise.errors import PoiseError
from poise.policy.mismatch import MismatchStats
from poise.policy.plan import MicroStats, StepPlan, loss_normaliser, step_stats, tail_shares
from poise.runtime.faults import wait
from poise.runtime.roles import PrefetchedSamples
from poise.training.reduce import index_nodes
from poise.types import Sample, SampleId, trained_tokens


class SampleSetError(PoiseError):
    """The samples that reached the trainer are not exactly the step's expected set."""


class StepLedger:
    """The exact set of sample ids a step needs; every arrival is checked against it."""

    def __init__(self, plan: StepPlan):
        self.step = plan.step
        self.expected = plan.sample_ids
        self._expected = set(self.expected)
        self.arrived: dict[SampleId, Sample] = {}

    def add(self, sample: Sample) -> None:
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


class TrainerGroup:
    """`helpers`, `helper_ranks` (`pipeline.assist`, sync only): the rollout devices that compute a
    share of the first mini-batch's micro-batches still unstarted when generation ends."""

    def __init__(self, workers: Sequence[object], ranks: Sequence[int], advantage: str, streaming: bool,
                 loss_agg: str, step_timeout_s: float = 600.0, helpers: Sequence[object] = (),
                 helper_ranks: Sequence[int] = (), rounds: bool = False, std_eps: float = STD_EPS):
        self.advantage, self.streaming, self.loss_agg = advantage, streaming, loss_agg
        self.std_eps = std_eps  # algorithm.std_eps: added to the std an advantage divides by
        # the train devices compute in rounds, one micro-batch each at a time, where their state makes every
        # forward and backward collective (cluster.shard full gathers parameters): `_dispatch_rounds`
        self.rounds = rounds
        self.step_timeout_s = step_timeout_s  # the heartbeat deadline of finish_step (runtime/faults.py)
        self.set_devices(workers, ranks, helpers, helper_ranks)
        self.micro_refs: list = []  # ((mini, [micro-batch indices]), device rank, ObjectRef)
        self.update_refs: list = []  # per mini-batch, every train device's update
        self.contribute_refs: list = []  # (helper rank, ObjectRef) of the helpers' parts of reductions
        self.prefetch_refs: list = []  # (device rank, ObjectRef) of micro-batches sent ahead (_prefetch)
        # async, the step generating while this one trains: its sample ids -> their micro-batch's ids
        self.next_micro: dict[SampleId, tuple[SampleId, ...]] = {}
        self.next_arrived: dict[SampleId, Sample] = {}
        # a micro-batch's ids -> (ObjectRef of its samples, those samples: used only if fed the same)
        self.early_refs: dict[tuple[SampleId, ...], tuple[object, list[Sample]]] = {}

    def set_devices(self, workers: Sequence[object], ranks: Sequence[int], helpers: Sequence[object] = (),
                    helper_ranks: Sequence[int] = ()) -> None:
        """The train devices (and helping rollout devices) after a live resize (between steps:
        nothing of a step is in flight)."""
        self.workers, self.ranks = list(workers), list(ranks)
        self.helpers, self.helper_ranks = list(helpers), list(helper_ranks)
        self.prefetched: dict[tuple[int, int], int] = {}  # what went to the old devices travels again

    def expect_next(self, plan: StepPlan) -> None:
        """async: step k+1 generates while step k trains; `arrive_ahead` puts each of its
        micro-batches in the object store as it completes, so that step k+1's `feed` (all its
        samples at once, at its start) only sends references: the puts are off the critical path
        of a step whose training is longer than the next generation."""
        self.next_micro = {sid: ids for mini in plan.minis for ids in mini.micro for sid in ids}
        self.next_arrived = {}
        self.early_refs = {ids: put for ids, put in self.early_refs.items() if ids[0][0] >= plan.step}

    def arrive_ahead(self, samples: Sequence[Sample]) -> None:
        """Samples of the step `expect_next` named (others are ignored: checked when fed)."""
        for sample in samples:
            sid = tuple(sample.sample_id)
            if sid not in self.next_micro or sid in self.next_arrived:
                continue  # the ledger of step k+1 reports it
            self.next_arrived[sid] = sample
            ids = self.next_micro[sid]
            if all(i in self.next_arrived for i in ids):
                samples_of = [self.next_arrived[i] for i in ids]
                self.early_refs[ids] = (ray.put(samples_of), samples_of)

    def start_step(self, plan: StepPlan, version: int) -> StepLedger:
        """`version`: the weights version the step's last update makes."""
        self.plan, self.version = plan, version
        self.next_micro, self.next_arrived = {}, {}  # what was put ahead for this step stays in put_ahead
        self.ledger = StepLedger(plan)
        self.rewards: dict[SampleId, float] = {}
        self.advantages: dict[SampleId, float] = {}
        self.dispatched: list[set[int]] = [set() for _ in plan.minis]
        self.micro_of = {sid: (mini.index, j) for mini in plan.minis for j, ids in enumerate(mini.micro) for sid in ids}
        self.batch_refs: dict[tuple[int, int], object] = {}  # (mini, micro) -> ObjectRef of its samples
        self.next_mini = 0
        # per mini-batch, device position (train devices, then helpers) -> the micro-batches it computes
        self.assigned: list[dict[int, list[int]]] = [{} for _ in plan.minis]
        self.rounds_sent = [0] * len(plan.minis)  # in rounds: those of each mini-batch dispatched
        self.micro_refs, self.update_refs, self.contribute_refs = [], [], []
        self.prefetched = {}  # (mini, micro) -> the train device (position) its samples were sent ahead to
        self.prefetch_refs = []
        return self.ledger

    def feed(self, scored: Sequence[tuple[Sample, float]]) -> None:
        """Accept finished samples with their rewards; start every micro-batch that became ready.

        A micro-batch's samples go into the object store as soon as they are all in, whatever the
        pipeline: the call that starts it later carries a reference, not megabytes of tokens."""
        for sample, reward in scored:
            self.ledger.add(sample)
            sid = tuple(sample.sample_id)
            self.rewards[sid] = reward
            u, j = self.micro_of[sid]
            ids = self.plan.minis[u].micro[j]
            if all(i in self.ledger.arrived for i in ids):
                samples = [self.ledger.arrived[i] for i in ids]
                ref, put = self.early_refs.pop(ids, (None, []))  # async: put while this step generated
                same = len(put) == len(samples) and all(a is b for a, b in zip(put, samples))
                self.batch_refs[(u, j)] = ref if same else ray.put(samples)
            self.advantages.update(ready_advantages(self.advantage, self.rewards, sid, self.plan.group_size,
                                                    self.plan.prompts, self.std_eps))
        if self.streaming or self.ledger.complete:
            self._dispatch_ready()
        self._prefetch()

    def _prefetch(self) -> None:
        """Send each complete micro-batch that cannot start yet (without streaming: until the whole
        batch is in) to the train device that owns it, which fetches the samples while generation
        goes on; the call that starts it then has nothing to fetch."""
        for u, j in sorted(self.batch_refs.keys() - self.prefetched.keys()):
            d = self._owner(u, j)
            self.prefetch_refs.append((self.ranks[d], self.workers[d].prefetch_samples.remote(
                (self.plan.step, u, j), self.batch_refs[(u, j)])))
            self.prefetched[(u, j)] = d

    def _dispatch_ready(self) -> None:
        devices = self.workers + self.helpers
        device_ranks = self.ranks + self.helper_ranks
        while self.next_mini < len(self.plan.minis):
            mini, done = self.plan.minis[self.next_mini], self.dispatched[self.next_mini]
            ready = [j for j, ids in enumerate(mini.micro)
                     if j not in done and all(i in self.advantages for i in ids)]
            if self.rounds:
                self._dispatch_rounds(mini, ready, done)
                if len(done) < len(mini.micro):
                    return
                self._queue_update(mini, devices, device_ranks)
                self.next_mini += 1
                continue
            if self.helpers and mini.index == 0 and self.ledger.complete:
                # generation is over: the rollout devices take a share of what has not started
                # (only of the first mini-batch: they hold the weights of its update, not the next's)
                tokens = [sum(len(self.ledger.arrived[i].prompt_ids) + len(self.ledger.arrived[i].token_ids)
                              for i in mini.micro[j]) for j in ready]
                owners = {j: d for d, share in enumerate(tail_shares(ready, len(devices), tokens)) for j in share}
            else:
                owners = {j: mini.owner(j) for j in ready}
            batches: dict[int, list[tuple[int, object, list[float]]]] = {}  # device position -> its ready batches
            for j in ready:
                ref = self.batch_refs.pop((mini.index, j))
                if self.prefetched.get((mini.index, j)) == owners[j]:  # the device holds them already
                    ref = PrefetchedSamples((self.plan.step, mini.index, j))
                batches.setdefault(owners[j], []).append((j, ref, [self.advantages[i] for i in mini.micro[j]]))
                self.assigned[mini.index].setdefault(owners[j], []).append(j)
                done.add(j)
            # one call per device for whatever became ready together (every control-plane call is
            # a driver round trip; in non-streaming mode the whole batch becomes ready at once)
            for d, mine in batches.items():
                self.micro_refs.append(((mini.index, [j for j, _, _ in mine]), device_ranks[d],
                                        devices[d].train_micro_batches.remote(mine)))
            if len(done) < len(mini.micro):
                return
            self._queue_update(mini, devices, device_ranks)
            self.next_mini += 1

    def _owner(self, u: int, j: int) -> int:
        """The train device (position) that computes micro-batch j of mini-batch u: the plan's
        contiguous ranges, or in rounds every W-th (`_dispatch_rounds`)."""
        return j % len(self.workers) if self.rounds else self.plan.minis[u].owner(j)

    def _dispatch_rounds(self, mini, ready: list[int], done: set[int]) -> None:
        """`cluster.shard: full`: the train devices gather each other's parameters module by
        module, so they compute in lockstep rounds (training/state/parameter_shards.py). Round r is micro-batches
        rW .. rW + W - 1, one per device (device d computes every W-th from d; past the last, a
        stand-in), so each round's gradients form aligned blocks of the tree and an owner holds
        about log2(M / W) + 1 partial sums of its slice, not one tree per device. A round goes out
        once all its micro-batches are ready (a device never waits inside a collective for samples
        still generating); one call per device for the rounds that became ready together."""
        parties, m = len(self.workers), len(mini.micro)
        calls: dict[int, list] = {d: [] for d in range(parties)}
        r, waiting = self.rounds_sent[mini.index], set(ready)
        while r * parties < m and all(j in waiting for j in range(r * parties, min(m, (r + 1) * parties))):
            for d in range(parties):
                j = r * parties + d
                if j >= m:
                    calls[d].append(None)
                    continue
                ref = self.batch_refs.pop((mini.index, j))
                if self.prefetched.get((mini.index, j)) == d:  # the device holds them already
                    ref = PrefetchedSamples((self.plan.step, mini.index, j))
                calls[d].append((j, ref, [self.advantages[i] for i in mini.micro[j]]))
                self.assigned[mini.index].setdefault(d, []).append(j)
                done.add(j)
            r += 1
        if r == self.rounds_sent[mini.index]:
            return
        self.rounds_sent[mini.index] = r
        for d, rounds in calls.items():
            self.micro_refs.append(((mini.index, [e[0] for e in rounds if e is not None]), self.ranks[d],
                                    self.workers[d].train_rounds.remote(rounds, self.ranks)))

    def _queue_update(self, mini, devices: list, device_ranks: list[int]) -> None:
        """Every micro-batch of `mini` is queued: queue its reduction on every device that holds
        some and the optimizer step on every train device. Only the leader's update waits on all
        micro-batches (its weights are the ones published; with real compute the all-gather makes
        every rank wait anyway); every device enters the all-gather only once every micro-batch
        succeeded (runtime/faults.py)."""
        assigned = self.assigned[mini.index]
        # helpers join only a reduction that has work of theirs: all of them then (one prewarmed group)
        helping = any(d >= len(self.workers) for d in assigned)
        parties = list(range(len(devices) if helping else len(self.workers)))
        ranks = [device_ranks[d] for d in parties]
        m = len(mini.micro)
        most_nodes = max(1, max(len(index_nodes(assigned[d], m)) for d in assigned))  # tree nodes on one device
        normaliser = loss_normaliser([[trained_tokens(self.ledger.arrived[i]) for i in ids] for ids in mini.micro],
                                     self.loss_agg)
        micro = [ref for (u, _), _, ref in self.micro_refs if u == mini.index]
        version = self.version if mini.index == len(self.plan.minis) - 1 else None  # the step's last update
        self.update_refs.append([w.apply_update.remote(m, sorted(assigned.get(d, [])), normaliser, ranks, most_nodes,
                                                       micro if d == 0 else None, None if d == 0 else micro,
                                                       version=version)
                                 for d, w in enumerate(self.workers)])
        self.contribute_refs += [(device_ranks[d], devices[d].contribute.remote(m, sorted(assigned.get(d, [])),
                                                                                 ranks, most_nodes, micro))
                                 for d in parties[len(self.workers):]]

    def queued_refs(self) -> list:
        """Every call queued in the current step (micro-batches, updates, helpers' parts of the
        reductions); none before the first step."""
        return ([ref for _, ref in self.prefetch_refs] + [ref for _, _, ref in self.micro_refs]
                + [ref for per_mini in self.update_refs for ref in per_mini] + [ref for _, ref in self.contribute_refs])

    def last_update_ref(self):
        """The train leader's (first train device's) last update of the step, once all are queued."""
        self.ledger.check_complete()  # a lost sample is the error to report, not a missing update
        self._dispatch_ready()
        if self.next_mini < len(self.plan.minis):
            raise SampleSetError(f"step {self.plan.step}: weights published before every update was queued")
        return self.update_refs[-1][0]

    def finish_step(self) -> tuple[dict, list[dict], list[dict]]:
        """Wait for every micro-batch and update of the step; returns the step's training stats,
        and the micro-batch and update records (device, start, end) for the event log."""
        self.ledger.check_complete()
        self._dispatch_ready()
        what = f"training of step {self.plan.step}"
        wait([ref for _, ref in self.prefetch_refs], [rank for rank, _ in self.prefetch_refs], what,
             self.step_timeout_s, role="train")
        done = wait([ref for _, _, ref in self.micro_refs], [rank for _, rank, _ in self.micro_refs],
                    what, self.step_timeout_s, role="train")
        records = {(u, j): m for ((u, js), _, _), per_call in zip(self.micro_refs, done) for j, m in zip(js, per_call)}
        micro = [records[key] for key in sorted(records)]  # (mini-batch, micro-batch) index order
        updates = [wait(refs, self.ranks, what, self.step_timeout_s, role="train") for refs in self.update_refs]
        if self.contribute_refs:
            wait([ref for _, ref in self.contribute_refs], [rank for rank, _ in self.contribute_refs], what,
                 self.step_timeout_s, role="train")
        stats = step_stats([MicroStats(m["loss_sum"], m["normaliser"], m["clipped"], m["kl_sum"], m["tokens"],
                                       m.get("entropy_sum", 0.0), m.get("mismatch", MismatchStats()),
                                       m.get("clipped_responses", 0), m.get("responses", 0))
                            for m in micro], [u[0]["grad_norm"] for u in updates])
        return stats, micro, [u for per_device in updates for u in per_device]
