"""The fault tests' injector (poise/injection.py): real deaths and hangs at exact moments, never a mock.

`Faults(kill=..., hang=..., checkpoint=...)`, each a spec string:

  kill  `<phase>:<step>:<device>[,...]`: ray.kill that device's actor (its process ends as if it
        crashed) when the driver reaches `phase` of `step` (generate: after the step's first
        samples arrived; train: generation over, its micro-batches queued or running; publish:
        the update done, the weight sync in flight; checkpoint: before the step's checkpoint is
        written; resize: as the resize after the step starts, before its first call), once each.
        An emulated device that shares its process dies with that process's other devices.
        `sync:<step>:<device>:<seconds>`: the device SIGKILLs its own process <seconds> after it
        enters the weight sync of `step` (sender or receiver), or at the sync's end if it is over
        sooner: a death at a chosen moment inside the broadcast, which a kill sent by the driver
        cannot hit (the sync of the tiny test model lasts milliseconds). Once per run: the device
        notes the moment in Ray's key-value store first, where its replacement sees it (and does
        not die again) and the driver reads it for the recovery's detection time.
  hang  `<submit|train>:<step>:<device>`: the device's actor sleeps forever in that call for the
        requests or micro-batches of `step`; `sync:<step>:<device>`: as it enters the weight sync
        of `step`, once per run (its replacement syncs).
  checkpoint  `<model|optimizer|state|marker>:<step>`: SIGKILL the saving process right after that
        part of the checkpoint of `step` is written (before the checkpoint is complete).

In the test's process `injected(...)` installs one for the runs inside it; a `poise` subprocess
loads one with POISE_FAULTS=<this file>:from_environment and FAULTS_CHECKPOINT=<spec>. The devices
get the driver's injector pickled in their WorkerSpec: this module goes by value, since their
processes cannot import tests/.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import ray.cloudpickle

from poise import injection
from poise.errors import PoiseError

KILL_PHASES = ("generate", "train", "publish", "checkpoint", "resize", "sync")  # sync: the device kills itself
CHECKPOINT_ENV = "FAULTS_CHECKPOINT"
LOAD_FROM_ENVIRONMENT = f"{Path(__file__).resolve()}:from_environment"  # a value for POISE_FAULTS

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class KillAt:
    """One kill of the `kill` spec; `after_s` (sync only): seconds into the device's weight sync."""

    def __init__(self, phase: str, step: int, device: int, after_s: float = 0.0):
        self.phase, self.step, self.device, self.after_s = phase, step, device, after_s

    def __eq__(self, other) -> bool:
        return isinstance(other, KillAt) and vars(self) == vars(other)

    def __repr__(self) -> str:
        return f"KillAt({self.phase!r}, {self.step}, {self.device}, {self.after_s})"


def parse_kills(spec: str) -> list[KillAt]:
    """The kills of `spec` (comma-separated), validated: a typo must not test nothing."""
    kills = []
    for part in filter(None, spec.split(",")):
        fields = part.split(":")
        try:
            kill = KillAt(fields[0], int(fields[1]), int(fields[2]), *map(float, fields[3:]))
        except (ValueError, IndexError, TypeError):
            kill = None
        if kill is None or kill.phase not in KILL_PHASES or (len(fields) == 4) != (kill.phase == "sync") \
                or not 0 <= kill.after_s < 3600:
            raise PoiseError(f"kill={spec!r}: expected <phase>:<step>:<device>[,...] with phase one of "
                             f"{', '.join(KILL_PHASES[:-1])}, or sync:<step>:<device>:<seconds>")
        kills.append(kill)
    return kills


class Faults:
    """An injector (poise.injection.FaultInjector) that kills and hangs as its specs say."""

    def __init__(self, kill: str = "", hang: str = "", checkpoint: str = ""):
        kills = parse_kills(kill)
        self.kills = [k for k in kills if k.phase != "sync"]  # the driver's: ray.kill at a phase
        self.sync_kills = tuple(k for k in kills if k.phase == "sync")  # the devices' own
        call, step, device = hang.split(":") if hang else ("", "-1", "-1")
        self.hang = (call, int(step), int(device))
        self.checkpoint = checkpoint
        self.key = f"poise-test-kill-{uuid.uuid4().hex}"  # this run's, in Ray's key-value store
        self.killed_at: float | None = None  # wall time of the driver's last kill, to measure detection
        self.killers: dict[int, SyncKiller] = {}  # a device's armed sync kill (in its process)

    # ---- the driver ----
    def phase_reached(self, phase: str, step: int, workers: Sequence) -> None:
        from poise.runtime import hosting

        for kill in [k for k in self.kills if (k.phase, k.step) == (phase, step)]:
            self.kills.remove(kill)
            hosting.kill(workers[kill.device])
            self.killed_at = time.time()

    def deaths(self) -> list[tuple[float, str | None]]:
        from ray.experimental import internal_kv

        out: list[tuple[float, str | None]] = [(self.killed_at, None)] if self.killed_at is not None else []
        self.killed_at = None
        for kill in self.sync_kills:  # each read once
            got = internal_kv._internal_kv_get(self.note(kill))
            if got is not None and got != b"read":
                when, where = got.decode().split("|")
                out.append((float(when), where))
                internal_kv._internal_kv_put(self.note(kill), b"read", overwrite=True)
        return out

    # ---- a device ----
    def before_submit(self, device: int, steps: Sequence[int]) -> None:
        self._maybe_hang("submit", device, steps)

    def before_train(self, device: int, steps: Sequence[int]) -> None:
        self._maybe_hang("train", device, steps)

    def sync_started(self, device: int, version: int) -> None:
        """The sync of step k publishes weights version k+1 (one version per step)."""
        from ray.experimental import internal_kv

        for kill in self.sync_kills:
            note = self.note(kill)
            if (kill.device, kill.step + 1) == (device, version) and not internal_kv._internal_kv_exists(note):
                self.killers[device] = SyncKiller(note, kill.after_s)
                break
        call, step, stuck = self.hang
        note = f"{self.key}:hang:{step}:{stuck}"
        if (call, stuck, step + 1) == ("sync", device, version) and not internal_kv._internal_kv_exists(note):
            internal_kv._internal_kv_put(note, b"hung", overwrite=True)
            _forever()

    def sync_finished(self, device: int, version: int) -> None:
        killer = self.killers.pop(device, None)
        if killer is not None:  # the sync ended before the kill's moment: it dies here, before answering
            killer.at_end()

    # ---- the process saving a checkpoint ----
    def checkpoint_part_written(self, part: str, step: int) -> None:
        if self.checkpoint == f"{part}:{step}":
            os.kill(os.getpid(), signal.SIGKILL)

    def note(self, kill: KillAt) -> str:
        return f"{self.key}:{kill.step}:{kill.device}"

    def _maybe_hang(self, call: str, device: int, steps: Sequence[int]) -> None:
        if self.hang[0] == call and self.hang[2] == device and self.hang[1] in steps:
            _forever()


class SyncKiller:
    """A device's death `after_s` into its weight sync: a timer thread SIGKILLs the process (as a
    crash: no clean-up, no reply) unless `at_end` comes first, which kills it there."""

    def __init__(self, note: str, after_s: float):
        self.note, self._lock, self._done = note, threading.Lock(), False
        self._armed = time.time()
        self._timer = threading.Timer(after_s, self.kill, args=("in the sync",))
        self._timer.daemon = True
        self._timer.start()

    def kill(self, where: str) -> None:
        from ray.experimental import internal_kv

        with self._lock:
            if self._done:
                return
            self._done = True
            now = time.time()
            note = f"{now!r}|{(now - self._armed) * 1e3:.1f} ms {where}"
            internal_kv._internal_kv_put(self.note, note.encode(), overwrite=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def at_end(self) -> None:
        """The sync returned before the moment: die now, before its result is sent."""
        self._timer.cancel()
        self.kill("at the sync's end")


def _forever() -> None:
    """A hung worker: it never answers again."""
    while True:
        time.sleep(3600)


@contextmanager
def injected(kill: str = "", hang: str = "", checkpoint: str = "") -> Iterator[Faults]:
    """Runs started inside this block (in this process) inject these faults."""
    faults = Faults(kill, hang, checkpoint)
    injection.install(faults)
    try:
        yield faults
    finally:
        injection.install(None)


def from_environment() -> Faults:
    """The injector of a `poise` subprocess (POISE_FAULTS=LOAD_FROM_ENVIRONMENT)."""
    return Faults(checkpoint=os.environ.get(CHECKPOINT_ENV, ""))
