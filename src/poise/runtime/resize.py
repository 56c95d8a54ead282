"""Live resize on the runtime (DynaResize §3, docs/design.md "Resize (live)"): devices switch between
the rollout and train roles between two steps, on the same long-lived actors, without a restart
and without changing a bit of what the job computes.

The layout is fixed: rollout devices are ranks [0, r), train devices [r, N), the train leader is
rank r. A resize from r to r' moves the devices between the two boundaries:

  rollout -> train (r' < r)   abort: the device's in-flight generation (the next step, queued
                              behind the last weight sync) comes back as partial samples and
                              unstarted requests, and goes to the remaining rollout devices, which
                              continue each partial with the same tokens (invariant 2). weights:
                              nothing moves, the device holds the current version from that sync.
                              optimizer: a staying train device sends the AdamW state through a
                              bounded host buffer in the background (training/state/transfer.py);
                              the joiner's first update waits for it (the explicit barrier).
  train -> rollout (r' > r)   the device frees its optimizer state and its engine starts from the
                              weights it holds (it shares the trainer's module tree).

Groups come from the communicator cache, created at start for every split the job may move to
(`prewarm_rank_sets`); a resize that had to create one reports it (`groups_created`). The
devices that do not switch keep working meanwhile: generation of the next step goes on on the
staying rollout devices, and the train devices are idle until that generation's samples arrive.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

from poise.config import ClusterConfig
from poise.policy.controller import ResizeConfig
from poise.policy.cost import CostModel
from poise.policy.split import Split
from poise.runtime import faults
from poise.runtime.service import StreamGenerationService
from poise.runtime.storage import CheckpointStore
from poise.runtime.topology import Devices, Topology


def roles_of(split: Split) -> tuple[list[int], list[int]]:
    """(rollout ranks, train ranks) of a split in the fixed layout."""
    return list(range(split.rollout)), list(range(split.rollout, split.rollout + split.train))


def prewarm_rank_sets(initial: Split, transitions: Sequence[tuple[Split, Split]]) -> list[list[int]]:
    """Every communicator the job may use, in one order all workers agree on: the train group and
    the weight-sync group (leader + rollout) of each split, and the optimizer staging group
    (a staying train device + the joiners) of each transition."""
    sets: list[list[int]] = []

    def add(ranks: list[int]) -> None:
        if ranks not in sets:
            sets.append(ranks)

    for split in [initial] + [s for pair in transitions for s in pair]:
        rollout, train = roles_of(split)
        add(train)
        add([train[0]] + rollout)
    for a, b in transitions:
        if b.rollout < a.rollout:
            add([a.rollout] + list(range(b.rollout, a.rollout)))
    return sets


@dataclass
class ResizeReport:
    """One live resize: what the `resize` event records (docs/events.md)."""

    step: int  # the last step on the old split
    from_split: Split
    to_split: Split
    to_train: list[int]
    to_rollout: list[int]
    phases: dict[str, float] = field(default_factory=dict)  # driver-side seconds per phase
    moved_samples: int = 0  # partial samples and requests handed to other rollout devices
    moved_tokens: int = 0  # tokens the partials had (not regenerated)
    groups_created: int = 0  # communicators created on the resize's path (0: all cached)
    staging: dict[int, dict] = field(default_factory=dict)  # joiner (sharded: every owner) -> bytes, seconds, peak buffer
    staged_by: list[int] = field(default_factory=list)  # cluster.shard: optimizer: the devices that resharded
    barrier_s: float = 0.0  # how long the first update on the new split waited for staging
    weights_held: dict[int, int] = field(default_factory=dict)  # shard: full: old train device -> most weight bytes
    weights_received: dict[int, int] = field(default_factory=dict)  # shard: full: old train device -> bytes received

    mode: str = "live"

    @property
    def critical_path_s(self) -> float:
        """How much later the job ends because of the resize: the driver's blocking phases (the
        devices that do not switch keep working through them) plus the update's barrier wait."""
        return sum(self.phases.values()) + self.barrier_s

    def event_fields(self) -> dict:
        staged = list(self.staging.values())
        return {"step": self.step, "from_split": self.from_split.as_list(), "to_split": self.to_split.as_list(),
                "mode": self.mode, "devices": self.to_train + self.to_rollout, "to_train": self.to_train,
                "to_rollout": self.to_rollout, "phases": dict(self.phases, barrier_wait=self.barrier_s),
                "background": {"optimizer_staging": max((s.get("seconds", 0.0) for s in staged), default=0.0)},
                "critical_path_s": self.critical_path_s, "moved_samples": self.moved_samples,
                "moved_tokens": self.moved_tokens,
                # weights moved between devices: only shard: full reshards them (else each holds them whole)
                "weights_bytes": sum(self.weights_received.values()),
                "optimizer_bytes": sum(s.get("bytes", 0) for s in staged),
                "bytes_moved": sum(s.get("bytes", 0) for s in staged),
                "peak_host_buffer_bytes": max((s.get("peak_buffer_bytes", 0) for s in staged), default=0),
                # what each device received and sent (sharded: old owners send, new owners receive)
                "optimizer_bytes_by_device": {str(d): s.get("bytes", 0) + s.get("sent_bytes", 0)
                                              for d, s in self.staging.items()},
                "groups_created": self.groups_created,
                # shard: full: the most weight bytes each old train device held while the weights resharded
                "weights_held_by_device": {str(d): b for d, b in self.weights_held.items()}}


class Resizable(Devices, Protocol):
    """What a resize works on (runtime.runtime.Runtime): the devices, the stream generation
    service whose instances change, and for a hard resize the checkpoint store and the actors'
    stop and start."""

    service: StreamGenerationService
    store: CheckpointStore
    emulation_cost: CostModel | None  # emulated compute: the scenario's prices
    time_scale: float  # emulated compute: wall seconds per cost-model second

    def stop(self) -> None: ...

    def start(self, topology: Topology, transitions: list[tuple[Split, Split]]) -> None: ...


def _on(rt: Devices, devices: list[int], call, what: str, timeout_s: float, start_up: bool = False) -> list:
    """`call(worker)` on each of `devices`, awaited with the step deadline `timeout_s`
    (`faults.wait`): a hung device ends the resize with one line, a dead one raises WorkerLost for
    the driver to recover. `start_up`: an engine or a model is built, which gets the start-up
    allowance."""
    if start_up:
        timeout_s = max(timeout_s, faults.START_UP_S)
    return faults.wait([call(rt.workers[d]) for d in devices], devices, what, timeout_s, rt)


def live_resize(rt: Resizable, to: Split, version: int, step: int, cluster: ClusterConfig, resize: ResizeConfig
                ) -> tuple[Topology, ResizeReport]:
    """Move devices between roles on the running job `rt` right after weights `version` reached
    every device. Returns the topology of `to`, for the runtime to install, and the report."""
    before = rt.topology
    old, after = before.split, before.resized(to)
    what = f"the resize {old.as_list()} -> {to.as_list()} after step {step}"
    new_rollout, new_train = list(after.rollout), list(after.train)
    to_train = [d for d in before.rollout if d in new_train]
    to_rollout = [d for d in before.train if d in new_rollout]
    report = ResizeReport(step, old, to, to_train, to_rollout)
    workers, staging_bytes = rt.workers, int(resize.staging_mb * 2**20)
    on = lambda devices, call, start_up=False: _on(rt, devices, call, what, cluster.step_timeout_s,  # noqa: E731
                                                   start_up)
    if rt.sharded:  # first: a leaving owner hands its state on before its engine starts (it waits for that)
        t = time.perf_counter()
        old_train = list(before.train)
        if rt.fully_sharded:  # parameters sharded too: a leaving device takes the whole model, a staying one its new run
            gathered = on(old_train, lambda w: w.gather_weights.remote(new_train))
            report.weights_held = {d: held for d, (held, _) in zip(old_train, gathered)}
            report.weights_received = {d: received for d, (_, received) in zip(old_train, gathered)}
        report.staged_by = sorted(set(old_train) | set(new_train))
        on(report.staged_by, lambda w: w.reshard_optimizer.remote(old_train, new_train, staging_bytes))
        report.phases["optimizer_staging_start"] = time.perf_counter() - t

    t = time.perf_counter()  # the leaving rollout devices give their generation back
    taken = on(to_train, lambda w: w.abort_generation.remote())
    rt.service.remove_instances(to_train)
    report.phases["abort"] = time.perf_counter() - t

    t = time.perf_counter()  # train -> rollout: the engine starts from the weights it holds
    on(to_rollout, lambda w: w.become.remote("rollout", version), start_up=True)
    rt.service.add_instances([workers[d] for d in to_rollout], to_rollout)
    report.phases["engine_build"] = time.perf_counter() - t

    t = time.perf_counter()  # the aborted work continues on the rollout devices now
    finished = [s for f, _, _ in taken for s in f]
    partials = [s for _, p, _ in taken for s in p]
    requests = [r for _, _, q in taken for r in q]
    report.moved_samples = rt.service.hand_over(finished, partials, requests)
    report.moved_tokens = sum(len(p.token_ids) for p in partials)
    report.phases["hand_over"] = time.perf_counter() - t

    t = time.perf_counter()  # rollout -> train: cached groups, weights already current
    on(to_train, lambda w: w.become.remote("train", version), start_up=True)
    if rt.fully_sharded:  # a joining device keeps its run, like the devices that stayed
        on(to_train, lambda w: w.shard_weights.remote(new_train))
    peer = next(d for d in before.train if d in new_train)  # a train device that stays
    report.phases["group_switch"] = time.perf_counter() - t  # the trainer takes the new group at `install`

    t = time.perf_counter()  # optimizer state streams to the joiners behind their first forward/backward
    if to_train and not rt.sharded:
        ranks = [peer] + to_train
        on(ranks, lambda w: w.transfer_optimizer.remote(peer, ranks, staging_bytes))
    if not rt.sharded:
        report.phases["optimizer_staging_start"] = time.perf_counter() - t
    report.groups_created = sum(on(list(range(len(workers))), lambda w: w.groups_created_after_prewarm.remote()))
    return after, report


def hard_resize(rt: Resizable, to: Split, version: int, step: int, run_dir: Path, cluster: ClusterConfig
                ) -> tuple[Topology, ResizeReport]:
    """The baseline (`resize.mode: hard`, DynaResize's restart): stop generating, checkpoint, kill
    every actor, place and start new ones on the new split, reload the checkpoint everywhere. The
    next step's generation is thrown away and starts again (same tokens: sampling is a function
    of the sample id). With emulated compute no weights exist: the checkpoint and the reload are
    the scenario's priced phases (`cost.resize_hard`), slept. Returns the topology of `to` (the
    runtime's already: its actors start in it) and the report."""
    before = rt.topology
    old, after = before.split, Topology.of_split(to, before.joined)
    report = ResizeReport(step, old, to, [d for d in before.rollout if d in after.train],
                          [d for d in before.train if d in after.rollout], mode="hard")
    emulated = rt.emulation_cost is not None
    what = f"the hard resize {old.as_list()} -> {to.as_list()} after step {step}"
    on = lambda devices, call: _on(rt, devices, call, what, cluster.step_timeout_s)  # noqa: E731

    t = time.perf_counter()
    on(list(before.rollout), lambda w: w.abort_generation.remote())
    report.phases["drain"] = time.perf_counter() - t

    t = time.perf_counter()
    if emulated:
        time.sleep(rt.emulation_cost.resize("hard").critical_path_s * rt.time_scale)  # export + restore
        path = None
    else:
        path = rt.store.save(before.leader, rt.workers[before.leader], Path(run_dir) / "resize-hard", step + 1, version,
                             what=f"the hard resize after step {step}")
    report.phases["checkpoint"] = time.perf_counter() - t

    t = time.perf_counter()
    rt.stop()
    report.phases["kill"] = time.perf_counter() - t

    t = time.perf_counter()
    rt.start(after, [])
    report.phases["start"] = time.perf_counter() - t

    t = time.perf_counter()
    if path is not None:
        devices = list(range(len(rt.workers)))
        states = faults.wait([w.load_checkpoint.remote(rt.store.readable(d, w, path), list(after.train))
                              for d, w in enumerate(rt.workers)], devices, what,
                             max(cluster.step_timeout_s, faults.START_UP_S), rt)
        rt.store.release()
        if {v for _, v in states} != {version}:
            raise RuntimeError(f"hard resize: reloaded weights versions {sorted({v for _, v in states})}, "
                               f"expected {version}")
        shutil.rmtree(Path(run_dir) / "resize-hard", ignore_errors=True)
    else:
        on(list(range(len(rt.workers))), lambda w: w.restore_version.remote(version))
    report.phases["reload"] = time.perf_counter() - t
    report.groups_created = sum(on(list(range(len(rt.workers))), lambda w: w.groups_created_after_prewarm.remote()))
    return after, report


def finish_report(rt: Devices, report: ResizeReport, updates: Sequence[dict], cluster: ClusterConfig) -> ResizeReport:
    """Complete a resize's report after the first step on the new split: what the staging moved,
    and how long that step's updates waited for it."""
    staged_by = report.staged_by or report.to_train  # sharded: every owner old and new; else the joiners
    if staged_by:
        reports = _on(rt, list(staged_by), lambda w: w.optimizer_transfer_report.remote(),
                      f"the optimizer transfer of the resize after step {report.step}", cluster.step_timeout_s)
        report.staging = dict(zip(staged_by, reports))
    report.barrier_s = max((u.get("barrier_s", 0.0) for u in updates), default=0.0)
    return report


def measure_resizes(model_path: str | None, devices: int, run_dir: Path) -> dict:
    """Price live and hard resizes on this machine (`poise profile --resize`): a short real job of
    `devices` CPU devices resizes by schedule, live at three steps and hard at two, and each mode's
    phases are the medians over its `resize` events. The resize controller reads them from the
    profile (CostModel.resize), so its break-even check weighs this machine's resize, not the
    paper's 187 s."""
    import json
    import statistics

    from poise.config import load_train_config
    from poise.runtime.driver import train_disaggregated

    half = devices // 2  # starts on an even split; resizes to both extremes and back
    cycle = [[1, devices - 1], [devices - 1, 1], [half, devices - half]]
    shape = ["run.progress=false", "run.checkpoint_every=0", "run.overwrite=true", "algorithm.prompts_per_step=4",
             "algorithm.group_size=4", "algorithm.micro_batch_size=4", "algorithm.sampling.max_new_tokens=16",
             "rollout.num_slots=8", f"cluster.devices={devices}", f"cluster.split=[{half},{devices - half}]",
             "pipeline.mode=sync", "resize.staging_mb=0.25", *([f"model.path={model_path}"] if model_path else [])]
    out = {}
    for mode, resizes in (("live", 3), ("hard", 2)):
        schedule = ", ".join(f"{{at_step: {k + 2}, split: {cycle[k % 3]}}}" for k in range(resizes))
        mode_dir = Path(run_dir) / mode
        cfg = load_train_config(None, [*shape, f"run.dir={mode_dir}", f"run.steps={resizes + 2}",
                                       f"resize.mode={mode}", f"resize.schedule=[{schedule}]"])
        train_disaggregated(cfg)
        events = [json.loads(line) for line in (mode_dir / "events.jsonl").read_text().splitlines()]
        found = [e for e in events if e["kind"] == "resize"]
        if not found:
            raise RuntimeError(f"the {mode} resize job in {mode_dir} logged no resize event")
        out[mode] = {"n": len(found),
                     "phases": {p: statistics.median(e["phases"][p] for e in found) for p in found[0]["phases"]},
                     "background": {p: statistics.median(e["background"][p] for e in found)
                                    for p in found[0].get("background", {})},
                     "critical_path_s": [e["critical_path_s"] for e in found]}
    return out
