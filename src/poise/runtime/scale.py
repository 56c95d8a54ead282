"""Elastic scale-out on the runtime (StreamRL §4.2, docs/design.md "Device pool"): a reserve device
joins the running job as one more rollout instance, without a restart and without changing a
bit of what the job computes (sampling is a function of the sample id: invariant 2).

The reserve. `cluster.reserve_devices` devices are a second placement group (cluster.reserve_pool),
bundle i is device `cluster.devices + i`. Their worker actors start with the job's, idle: a
torch.distributed world (gloo/NCCL) has a fixed size set at its rendezvous, so a process that
was not at it cannot broadcast with the others later; the reserve's actors are therefore members
of the world from the start and hold no role until they join. Departure from StreamRL, which
acquires new machines: with Ray's placement groups the reserve is held, not acquired, and a job on
a cluster whose free devices come and go would need a world per join (not done).

A join, between two steps (after weights version v reached every rollout device):
  add       the joiners take the rollout role and the stream generation service adds them as
            instances: the dispatcher plans over them from the next step it dispatches
            (`policy.scale.first_step_served`: the next step's generation, two in async, is
            already queued on the other instances).
  weights   the next weight sync (version v+1, queued behind the step's last update) is the
            bucketed broadcast from the train leader over the cached group {leader} + rollout
            devices + joiners, and reaches the joiners before the first step they generate for
            asks for any weights; a broadcast of version v at the join would be overwritten
            unused, so there is none. Until then a joiner holds its initial weights and serves
            nothing.
Groups come from the communicator cache, created at start (`scale_rank_sets`); a join whose
groups were not prewarmed would deadlock (dist.new_group is collective over the whole world),
so `groups_created` is reported and expected to be 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import ray

from poise.config import ClusterConfig
from poise.policy.scale import ScaleConfig, ScaleObservation, ScalePolicy, first_step_served, make_scale_policy
from poise.runtime.service import StreamGenerationService
from poise.runtime.topology import Devices, Topology


def join_chunks(c: ClusterConfig, sc: ScaleConfig) -> list[list[int]]:
    """The reserve devices that join together, in joining order: the schedule's groups, or one at
    a time (the controller)."""
    reserve = list(range(c.devices, c.devices + c.reserve_devices))
    sizes = list(sc.scheduled().values()) if sc.schedule else [1] * sc.most_added(c.reserve_devices)
    chunks, first = [], 0
    for n in sizes:
        chunks.append(reserve[first:first + n])
        first += n
    return chunks


def scale_rank_sets(cluster: ClusterConfig, scale: ScaleConfig, leader: int, rollout: list[int]) -> list[list[int]]:
    """Every communicator a join may use, in one order all workers agree on: after each join, the
    weight-sync group of the grown pool."""
    sets: list[list[int]] = []
    joined: list[int] = []
    for chunk in join_chunks(cluster, scale):
        joined = joined + chunk
        sets.append([leader] + rollout + joined)
    return sets


@dataclass
class JoinReport:
    """One join: what the `join` event records (docs/events.md)."""

    step: int  # the join happened after this step's weight sync
    devices: list[int]
    instances: int  # rollout instances after the join
    first_step: int
    weights_version: int  # the version the next weight sync brings them
    reason: str
    phases: dict[str, float] = field(default_factory=dict)
    groups_created: int = 0

    def event_fields(self) -> dict:
        return {"step": self.step, "devices": self.devices, "instances": self.instances,
                "first_step": self.first_step, "weights_version": self.weights_version, "reason": self.reason,
                "phases": dict(self.phases), "groups_created": self.groups_created}


class Joinable(Devices, Protocol):
    """What a join works on: the devices, and the stream generation service that adds instances."""

    service: StreamGenerationService
    time_scale: float  # emulated compute: wall seconds per cost-model second


def join_rollout(rt: Joinable, devices: list[int]) -> tuple[Topology, dict[str, float]]:
    """Reserve `devices` join the running job `rt` as rollout instances; the next weight sync
    includes them. Returns the topology with them (a restart of the actors, fault recovery, keeps
    them rollout instances) and the seconds of each phase."""
    t = time.perf_counter()
    ray.get([rt.workers[d].set_role.remote("rollout") for d in devices])
    rt.service.add_instances([rt.workers[d] for d in devices], devices)
    return rt.topology.with_joined(devices), {"add": time.perf_counter() - t}


class ScaleOut:
    """The driver's side of scale-out: once per step the scale policy observes the step (every
    decision is logged) and a join happens here, between this step's weight sync and the next
    step's generation."""

    def __init__(self, cluster: ClusterConfig, scale: ScaleConfig, steps: int, kind: str, rt: Joinable,
                 now: Callable[[], float], policy: ScalePolicy | None = None):
        """`steps`: run.steps; `kind`: the pipeline's (sync | stream | async)."""
        self.scale, self.steps, self.kind, self.rt, self.now = scale, steps, kind, rt, now
        self.policy = policy or make_scale_policy(scale, cluster.reserve_devices)
        self.chunks = join_chunks(cluster, scale)
        self.reports: list[JoinReport] = []

    def after_step(self, log, step: int, times: tuple[float, float, float, float], micro: list[dict],
                   updates: list[dict], version: int) -> Topology | None:
        """`times`: run-time start, generation end, train end and end of the step; `micro`,
        `updates`: the step's train records (wall clock), whose busiest device is the train time.
        Returns the topology with the joined devices, for the runtime to install, if some joined."""
        if not self.scale.active or step + 1 >= self.steps:
            return None
        t_start, t_gen, _, t_end = times
        busy: dict[int, float] = {}
        for r in list(micro) + list(updates):
            busy[r["device"]] = busy.get(r["device"], 0.0) + r["end"] - r["start"]
        k = 1.0 / self.rt.time_scale  # emulated compute: wall seconds -> the cost model's seconds
        obs = ScaleObservation(step, k * (t_gen - t_start), k * max(busy.values(), default=0.0),
                               len(self.rt.topology.rollout))
        decision = self.policy.observe(obs, k * t_end)
        log.event("decision", t_end, **decision.event_fields())
        if decision.action != "add" or len(self.reports) >= len(self.chunks):
            return None  # or the reserve is spent (the policies know their cap: not reached)
        devices = self.chunks[len(self.reports)]  # one decision, one chunk (the devices it adds)
        start = self.now()
        topology, phases = join_rollout(self.rt, devices)
        report = JoinReport(step, devices, len(topology.rollout), first_step_served(step, self.kind),
                            version + 1, decision.reason, phases,
                            sum(ray.get([w.groups_created_after_prewarm.remote() for w in self.rt.workers])))
        self.reports.append(report)
        log.event("join", start, start=start, end=self.now(), **report.event_fields())
        t = start
        for phase, seconds in phases.items():  # on the joining devices' rows
            for d in devices:
                log.event("interval", t, device=d, role="resize", phase=f"join_{phase}", step=step, start=t,
                          end=t + seconds)
            t += seconds
        return topology


__all__ = ["ScaleOut", "JoinReport", "join_rollout", "join_chunks", "scale_rank_sets"]
