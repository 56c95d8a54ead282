"""Fault handling (docs/design.md "Faults"; RELIABILITY.md): every wait on a device has a deadline, a dead
worker is replaced and the step it broke runs again, and what cannot be recovered stops the run
with one line.

Deadlines. `wait` is `ray.get` with `cluster.step_timeout_s` as a heartbeat: the clock restarts
each time one of the awaited results arrives, so a long step made of many short calls is never
cut, and a device silent for `step_timeout_s` (a hung call, a collective with a missing peer,
an engine that stopped stepping) ends the run with one line naming it. gloo collectives carry the
same timeout (runtime/worker.py), so no survivor waits 30 minutes on a dead peer.

Recovery. A worker that dies mid-step (`ray.kill`, a crashed process, a lost node) surfaces as a
`WorkerLost` from any wait. The driver then calls `recover`: a surviving train device (train
devices hold full replicas: weights and optimizer state) writes its state to a scratch
checkpoint, every actor is stopped and a fresh one started in each device's bundle (a fresh
torch.distributed world, its communicators re-created and pre-warmed through the communicator
cache), and every device loads that state. The step then runs again from the phase that broke:
its generation and training if its update had not happened (sampling is a function of the sample
id, so the step's samples are the same tokens), only the weight publish if it had. Departure
from the issue's "restart the dead actor alone": the torch.distributed world of the survivors
cannot take in a new process, and its store lives on device 0, so the whole world is re-formed,
as a hard resize does; the cost is measured in RELIABILITY.md.

Unrecoverable: every train device gone (no replica of the optimizer state survives), a death
inside a step whose earlier update already happened on some device (updates_per_step > 1), or
more than `cluster.max_recoveries` deaths. The run stops with one line naming the device and the
step; the last checkpoint is intact and `--resume` continues from it.

Faults are made on purpose, to test and measure all this with real deaths, through the injector
of poise/injection.py, which the driver and the devices call at named moments.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Sequence

import ray
from ray.exceptions import RayActorError, RayTaskError

from poise.config import ClusterConfig
from poise.errors import PoiseError
from poise.policy.split import Split
from poise.runtime import hosting
from poise.runtime.topology import Devices, Topology

if TYPE_CHECKING:
    from poise.runtime.storage import CheckpointStore

PROBE_S = 5.0  # how long a survivor has to answer the probe after a failure
START_UP_S = 300.0  # at least this long for the actors' start (model build, rendezvous) on a loaded machine


class RunFailure(PoiseError):
    """A device failed in a way the run did not survive; the message is the one line to print."""

    exit_code = 1


class StepTimeout(RunFailure):
    """A device made no progress for cluster.step_timeout_s."""


class WorkerLost(Exception):
    """A device's actor died; `recover` can replace it. Not user-facing: the driver handles it."""

    def __init__(self, devices: Sequence[int], what: str):
        self.devices, self.what = sorted(devices), what
        super().__init__(f"device(s) {self.devices} lost during {what}")


def role_of(rt: Devices, device: int) -> str:
    return rt.topology.role_of(device)


def wait(refs: Sequence, devices: Sequence[int], what: str, timeout_s: float, rt=None, role: str | None = None
         ) -> list:
    """`ray.get(refs)` with a heartbeat deadline: fails if no result arrives for `timeout_s`.

    `devices[i]` is the device that runs `refs[i]` (for the one-line message, with its role from
    `rt` or `role`). A dead actor, or a
    call that failed because another actor died (a collective with a dead peer, a get of a dead
    actor's result), raises WorkerLost; any other error is raised as it is. Either is raised as
    soon as it arrives, not after the other calls: gloo does not notice a dead peer, so a survivor
    in a collective with it waits there until gloo's timeout (`step_timeout_s`), and recovery
    replaces every actor anyway.
    """
    at: dict = {}  # ref -> its indices in refs
    for i, ref in enumerate(refs):
        at.setdefault(ref, []).append(i)
    out: list = [None] * len(refs)
    pending = list(at)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
        if not ready:
            late = sorted({devices[i] for ref in pending for i in at[ref]})
            raise StepTimeout(hang_message(rt, late, what, timeout_s, role))
        if pending:  # collect whatever else is done, then restart the clock
            more, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
            ready += more
        for ref in ready:
            try:
                result = ray.get(ref)
            except (RayActorError, RayTaskError) as e:
                raise lost_or_raise(rt, e, [devices[i] for i in at[ref]], what) from e
            for i in at[ref]:
                out[i] = result
    return out


def get(ref, device: int, what: str, timeout_s: float, rt=None):
    """One call's result with a deadline (see `wait`)."""
    return wait([ref], [device], what, timeout_s, rt)[0]


def hang_message(rt, devices: list[int], what: str, timeout_s: float, role: str | None = None) -> str:
    names = ", ".join(f"device {d} ({role_of(rt, d) if rt is not None else role})" if rt is not None or role
                      else f"device {d}" for d in devices)
    return (f"{names} made no progress for {timeout_s:g} s during {what}; the run stopped and released its devices "
            "(raise cluster.step_timeout_s if its steps are that long, else look at that worker's log; "
            "--resume continues from the last checkpoint)")


def lost_or_raise(rt, error: BaseException, devices: list[int], what: str) -> BaseException:
    """The exception to raise for a failed call: WorkerLost naming the dead devices if any actor of
    the job died (the failure may be a survivor's, e.g. a collective with the dead peer), else the
    call's own error."""
    dead = dead_devices(rt) if rt is not None else []
    if isinstance(error, RayActorError) and not isinstance(error, RayTaskError):
        dead = sorted(set(dead) | set(devices))
    if dead:
        return WorkerLost(dead, what)
    cause = getattr(error, "cause", None)
    if isinstance(error, RayTaskError) and isinstance(cause, PoiseError):  # its one line, not Ray's traceback
        return cause
    return error


def dead_devices(rt) -> list[int]:
    """Devices whose actor is dead. A busy actor answers the probe late, so only Ray's word that
    the actor died counts (it comes at once), not silence within PROBE_S."""
    refs = [w.held_version.remote() for w in rt.workers]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=PROBE_S)
    dead = []
    for device, ref in enumerate(refs):
        if ref not in ready:
            continue
        try:
            ray.get(ref)
        except RayActorError:
            dead.append(device)
    return dead


# ---- recovery ----------------------------------------------------------------------------------
def settled_updates(trainer, timeout_s: float) -> str:
    """Whether the updates the trainer queued in the step that broke happened: 'none', 'all' (on
    every train device) or 'some'. Waits for the calls still running (a survivor's collective
    with a dead peer fails at once; gloo's timeout bounds the rest)."""
    refs = [ref for per_mini in trainer.update_refs for ref in per_mini]
    if not refs:
        return "none"
    ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    ok = 0
    for ref in refs:
        try:
            ray.get(ref, timeout=0)
            ok += 1
        except Exception:  # noqa: BLE001 - failed, died or still hung: not done
            pass
    return "none" if ok == 0 else "all" if ok == len(refs) and trainer.next_mini == len(trainer.plan.minis) else "some"


class Recoverable(Devices, Protocol):
    """What a recovery works on (runtime.runtime.Runtime): the devices, the checkpoint store that
    saves and loads the surviving replica, and the actors' start in a topology."""

    store: CheckpointStore
    transitions: list[tuple[Split, Split]]  # the splits a live resize may move between

    def start(self, topology: Topology, transitions: list[tuple[Split, Split]]) -> None: ...


@dataclass(frozen=True)
class Recovery:
    topology: Topology  # the devices' roles after it: those of the step that broke
    source: int  # the train device whose replica was restored
    what: str  # one line for the console
    silent: list[int]  # survivors that did not answer the probe: busy in a collective with the dead device


def recover(rt: Recoverable, lost: WorkerLost, step: int, version: int, rollout_version: int, run_dir: Path,
            cluster: ClusterConfig) -> Recovery:
    """Replace every actor of `rt` and restore a surviving replica on each, in the roles of
    `rt.topology`: the train devices get a surviving train device's weights and optimizer state
    (weights `version`); the rollout devices get weights `rollout_version`, from a surviving
    rollout device if the train devices already moved past it (async: the next step's generation
    needs the weights before the update)."""
    topology = rt.topology
    dead = sorted(set(lost.devices) | set(dead_devices(rt)))
    roles = [role_of(rt, d) for d in dead]
    survivors = [d for d in topology.train if d not in dead]
    if not survivors:
        raise RunFailure(unrecoverable(rt, dead, step, run_dir, "no train device survives to restore from"))
    if rt.sharded and any(d in topology.train for d in dead):
        what = "weights and optimizer state" if rt.fully_sharded else "optimizer state"
        raise RunFailure(unrecoverable(rt, dead, step, run_dir, f"with cluster.shard={cluster.shard} its part "
                                                                f"of the {what} has no replica"))
    held = {d: v for d, v in zip(range(len(rt.workers)), _held_versions(rt, dead))}
    silent = [d for d, v in held.items() if v is None and d not in dead]
    source = next((d for d in survivors if held[d] == version), survivors[0])
    if held[source] is None:
        raise RunFailure(unrecoverable(rt, dead, step, run_dir, f"no surviving train device answered within "
                                                                f"{PROBE_S:g} s (one waits in a collective with the "
                                                                "dead device)"))
    if held[source] != version:
        raise RunFailure(unrecoverable(rt, dead, step, run_dir, f"train device {source} holds weights version "
                                                                f"{held[source]}, not {version}"))
    rollout_source = source
    if rollout_version != version:
        rollout_source = next((d for d in topology.rollout if d not in dead and held[d] == rollout_version), None)
        if rollout_source is None:
            raise RunFailure(unrecoverable(rt, dead, step, run_dir, f"no device holds weights version "
                                                                    f"{rollout_version} any more"))
    scratch = Path(run_dir).resolve() / "recover"  # the driver's run.dir, not relative to a worker's directory
    saves = {source: (scratch / "train", version)}
    if rollout_source != source:
        saves[rollout_source] = (scratch / "rollout", rollout_version)
    try:  # into the driver's run.dir, through the driver for a node that does not see it (runtime/storage.py)
        paths = {d: rt.store.save(d, rt.workers[d], where, step, v, what=f"step {step}: saving the surviving replica")
                 for d, (where, v) in saves.items()}
    except WorkerLost as e:
        raise RunFailure(unrecoverable(rt, dead + e.devices, step, run_dir, "a survivor died while it was saved")
                         ) from None
    from poise.training.checkpoint import verify_checkpoint  # torch: driver only

    for d, path in paths.items():  # by content (sha256, finite weights) before every device loads it
        problem = verify_checkpoint(Path(path))
        if problem is not None:
            raise RunFailure(unrecoverable(rt, dead, step, run_dir, f"the replica device {d} saved does not verify "
                                                                    f"({problem})"))
    rollout_ranks = set(topology.rollout)
    stop_workers(rt.workers, PROBE_S)
    rt.start(topology, rt.transitions)
    path_of = [paths[rollout_source] if d in rollout_ranks else paths[source] for d in range(len(rt.workers))]
    what = f"step {step}: restoring the surviving replica"
    states = wait([w.load_checkpoint.remote(rt.store.readable(d, w, p, what), list(topology.train))
                   for d, (w, p) in enumerate(zip(rt.workers, path_of))], list(range(len(rt.workers))), what,
                  cluster.step_timeout_s, rt)
    rt.store.release()
    shutil.rmtree(scratch, ignore_errors=True)
    want = [rollout_version if d in rollout_ranks else version for d in range(len(rt.workers))]
    if [v for _, v in states] != want:
        raise RunFailure(f"recovery at step {step}: devices restored weights versions {[v for _, v in states]}, "
                         f"expected {want}; resume from the last checkpoint with --resume {run_dir}")
    return Recovery(topology, source, f"device(s) {dead} ({', '.join(roles)}) died at step {step}; replaced, and "
                                      f"restored from device {source}", silent)


def step_refs(trainer) -> list:
    """Every call the trainer queued in its current step (micro-batches, updates, helpers' parts)."""
    return trainer.queued_refs()


def drain(refs: Sequence) -> None:
    """Read the results of calls that a recovery abandoned (their actors are gone by now), so that
    Ray does not print their errors as unhandled tracebacks."""
    for ref in refs:
        try:
            ray.get(ref, timeout=PROBE_S)
        except Exception:  # noqa: BLE001 - failed or killed: that is why they are abandoned
            pass


def _held_versions(rt, dead: list[int]) -> list[int | None]:
    """The weights version each device holds; None for a dead one and for one that does not answer
    within PROBE_S: a survivor in a collective with the dead device (a weight sync's broadcast)
    answers only when gloo gives up, after cluster.step_timeout_s, and every actor is replaced
    anyway, so recovery does not wait for it."""
    live = [d for d in range(len(rt.workers)) if d not in dead]
    refs = [rt.workers[d].held_version.remote() for d in live]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=PROBE_S)
    got = {}
    for d, ref in zip(live, refs):
        if ref in ready:
            try:
                got[d] = ray.get(ref)
            except (RayActorError, RayTaskError):
                pass
    return [got.get(d) for d in range(len(rt.workers))]


def unrecoverable(rt, dead: list[int], step: int, run_dir: Path, why: str) -> str:
    """The one line of a death the run cannot recover from. The checkpoint it names was verified by
    content (as --resume will), never assumed intact because it is the newest directory."""
    from poise.training.checkpoint import newest_intact_checkpoint

    names = ", ".join(f"device {d} ({role_of(rt, d)})" for d in dead)
    intact, skipped = newest_intact_checkpoint(run_dir)
    damaged = "".join(f"{name} is damaged ({problem}); " for name, problem in skipped)
    if intact is not None:
        resume = f"{damaged}the last checkpoint {intact.name} is intact: continue with --resume {run_dir}"
    elif skipped:
        resume = f"{damaged}no intact checkpoint is left: start it again"
    else:
        resume = "no checkpoint was written yet (run.checkpoint_every): start it again"
    return f"{names} died at step {step} and {why}; the run stopped and released its devices; {resume}"


def stop_workers(workers: Sequence, timeout_s: float) -> None:
    """Shut every worker down and kill its actor, waiting at most `timeout_s` for the polite part:
    a dead or hung actor must not keep the run (or its placement group) alive."""
    refs = []
    for w in workers:
        try:
            refs.append(w.shutdown.remote())
        except Exception:  # noqa: BLE001 - a dead handle: nothing to shut down
            pass
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for w in workers:
        try:
            hosting.kill(w)
        except Exception:  # noqa: BLE001 - already gone
            pass
