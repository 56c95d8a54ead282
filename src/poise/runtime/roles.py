"""The roles a device worker plays, as small Protocols with a real and an emulated implementation
(a mode is another implementation of a role, not an `if emulated:` in every method).

    RolloutEngine  continuous batching (poise.rollout.engine.Engine | runtime.emulated.EmulatedEngine)
    TrainShard     gradients of canonical micro-batches and the exact update
                   (runtime.train_shard.TorchTrainShard | runtime.emulated.EmulatedTrainShard)
    WeightSync     weights trainer -> rollout (runtime.weight_sync.BroadcastSync | runtime.emulated.EmulatedSync)

`EngineLoop` runs a RolloutEngine on its own thread inside the actor, so generation never waits
for the driver: requests go in with `submit`, finished samples collect in an outbox that the
driver empties in batches with `take`. The old control plane ran engine steps only inside a poll
RPC, so every finish stalled its engine for a driver round trip (~0.44 s a step).

Torch-free: an emulated actor imports this module and never torch.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol, Sequence

from poise.rollout.occupancy import Occupancy
from poise.types import Request, Sample, SampleId


@dataclass(frozen=True)
class PrefetchedSamples:
    """In a train call, in place of a micro-batch's samples: those sent to the device ahead of it
    (`DeviceWorker.prefetch_samples`) under `key` = (step, mini-batch, micro-batch)."""

    key: tuple[int, int, int]


class RolloutEngine(Protocol):
    def submit(self, request: Request) -> None: ...

    def step(self) -> list[Sample]: ...

    @property
    def occupancy(self) -> Occupancy:
        """Its running and queued sequences, read together; idle when there are none."""
        ...

    def abort(self) -> list[Sample]:
        """Stop every queued and running sequence; their partial samples (finish_reason 'abort')."""
        ...

    def resume(self, partials: Sequence[Sample], windows: Mapping[SampleId, int] | None = None) -> None:
        """Continue partial samples (from `abort` on any engine holding the same weights, or partial
        rollouts' carrying per-token versions); one named in `windows` comes back unfinished after
        that many more tokens."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int) -> None: ...

    def set_weights_version(self, version: int) -> None: ...

    def release(self) -> None:
        """Free what generation holds (the KV cache): the device leaves the rollout role."""
        ...


class TrainShard(Protocol):
    def train_micro_batch(self, index: int, samples: Sequence[Sample], advantages: Sequence[float]) -> dict: ...

    def apply_update(self, num_micro_batches: int, indices: list[int], normaliser: float, ranks: list[int],
                     rows: int, inputs_ready: float | None = None) -> dict:
        """Reduce the gradients of micro-batches `indices` with those of the other `ranks` and step;
        `rows`: the most tree nodes any of `ranks` holds; `inputs_ready`: wall time the mini-batch's
        last micro-batch ended (a real shard's all-gather waits for it by itself)."""
        ...

    def contribute(self, num_micro_batches: int, indices: list[int], ranks: list[int], rows: int) -> dict:
        """A helping rollout device's part of the reduction (`pipeline.assist`); no step."""
        ...

    def save_checkpoint(self, run_dir: str, step: int, version: int, extra: dict[str, bytes] | None = None,
                        ranks: list[int] | None = None, parallel: bool = False) -> str: ...

    def load_checkpoint(self, path: str, train_ranks: list[int] | None = None) -> tuple[int, int]: ...

    def digest(self) -> str: ...

    def transfer_optimizer(self, src: int, ranks: list[int], buffer_bytes: int) -> None:
        """Live resize: send (rank == src) or receive the optimizer state in the background."""
        ...

    def wait_optimizer_transfer(self) -> float: ...

    def optimizer_transfer_report(self) -> dict: ...

    def drop_optimizer(self) -> None: ...


class WeightSync(Protocol):
    def prewarm(self, rank_sets: list[list[int]]) -> int: ...

    def groups_created_after_prewarm(self) -> int: ...

    def publish(self, src: int, ranks: list[int], version: int, bucket_mb: float,
                sender_ready: float | None = None, sources: list[int] | None = None) -> float:
        """Send (rank == src) or receive the weights into the engine, stamping `version`;
        `sender_ready`: wall time the sender's last update ended (when the transfer can start);
        `sources` (`cluster.shard: full`): every train device sends the parameters it owns."""
        ...


class BackgroundTask:
    """`fn()` on a thread of its own, which a later call waits for (a live resize's optimizer
    transfer, that the next update and checkpoint must see whole)."""

    def __init__(self, fn, name: str):
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - raised by join, in the call that needs the result
            self._error = e

    def join(self) -> float:
        """Wait for it (the explicit barrier); returns the seconds waited, or raises its error."""
        t = time.time()
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"{self._thread.name} failed: {self._error!r}") from self._error
        return time.time() - t


class EngineLoop:
    """A RolloutEngine driven by its own thread; the actor's RPC thread only hands work in and out.

    At most `cap` requests are inside the engine at a time (the dispatcher's live-batch cap, e.g.
    the long-tail instances' small batches); the rest wait here and go in as slots free up.
    """

    def __init__(self, engine: RolloutEngine, clock=time.time):
        self.engine, self.clock = engine, clock
        self._cv = threading.Condition()
        self._engine_lock = threading.Lock()  # engine.step vs load_weights
        # callers waiting for the engine between two steps: the loop lets them in before its next
        # step (a plain lock is not fair: the loop's thread would take it back at once, again and
        # again on a fast CPU, and an abort would wait for the whole generation)
        self._waiting = 0
        self._pending: deque[Request] = deque()
        self._outbox: list[Sample] = []
        self._outbox_since = 0.0  # when the oldest sample in the outbox arrived
        self._in_flight = 0  # submitted and not yet in the outbox; changes only under _cv
        self._cap = 1
        self._error: BaseException | None = None
        self._busy_since: float | None = None
        self._busy: list[tuple[float, float]] = []  # closed busy intervals not yet taken
        self._stop = False
        self._admitting: list[Request] = []  # taken from _pending by the loop, not yet in the engine
        self._epoch = 0  # bumped by every abort
        self.steps = 0  # engine steps taken: the heartbeat of a generation with no sample finished yet
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    # ---- the actor's side ---------------------------------------------------------------
    def submit(self, requests: Sequence[Request], cap: int) -> None:
        with self._cv:
            self._raise_error()
            self._cap = max(1, cap)
            self._pending.extend(requests)
            self._in_flight += len(requests)
            self._cv.notify_all()

    def take(self, timeout: float, linger: float = 0.0) -> tuple[list[Sample], int, list[tuple[float, float]]]:
        """Wait up to `timeout` s for finished samples; returns them, how many requests are still in
        flight here, and the busy intervals closed since last time. `linger`: once a sample is in,
        return when the oldest one has waited `linger` s or nothing is left in flight, so that one
        reply carries the samples that finish close together (each reply is a wake-up of the
        actor's thread beside the engine's); the last sample of a generation never waits."""
        with self._cv:
            self._cv.wait_for(lambda: self._outbox or self._error is not None or self._in_flight == 0, timeout)
            if self._outbox and self._in_flight and linger > 0:
                left = linger - (self.clock() - self._outbox_since)
                if left > 0:
                    self._cv.wait_for(lambda: self._error is not None or self._in_flight == 0, left)
            self._raise_error()
            out, self._outbox = self._outbox, []
            busy, self._busy = self._busy, []
            return out, self._in_flight, busy

    def abort(self) -> tuple[list[Sample], list[Sample], list[Request]]:
        """Stop generating (a live resize takes this device): returns the finished samples not yet
        taken, the partial samples of every running or engine-queued sequence, and the requests
        that never reached the engine. Nothing is left in flight here."""
        with self._between_steps(), self._cv:
            self._raise_error()
            partials = self.engine.abort()
            pending = self._admitting + list(self._pending)  # taken by the loop but not yet submitted, first
            self._pending, self._admitting = deque(), []
            self._epoch += 1
            finished, self._outbox = self._outbox, []
            self._in_flight = 0
            if self._busy_since is not None:
                self._busy.append((self._busy_since, self.clock()))
                self._busy_since = None
            self._cv.notify_all()
            return finished, partials, pending

    def resume(self, partials: Sequence[Sample], requests: Sequence[Request], cap: int,
               windows: Mapping[SampleId, int] | None = None) -> None:
        """Take over another device's partial samples (continued first) and unstarted requests;
        `windows`: partial rollouts' per-sample token budgets (`RolloutEngine.resume`)."""
        with self._between_steps(), self._cv:
            self._raise_error()
            if windows:
                self.engine.resume(partials, windows)
            else:
                self.engine.resume(partials)
            self._cap = max(1, cap)
            self._pending.extend(requests)
            self._in_flight += len(partials) + len(requests)
            self._cv.notify_all()

    def wait_idle(self) -> None:
        """Block until every request handed in has finished and the loop is between steps: a train
        device that generated (`pipeline.assist`) must not change the weights its engine reads."""
        with self._cv:
            self._cv.wait_for(lambda: self._in_flight == 0 or self._error is not None)
            self._raise_error()
        with self._between_steps():
            pass

    def with_engine(self, fn):
        """Run `fn(engine)` with the loop paused between steps (weights, versions, checkpoints)."""
        with self._between_steps():
            return fn(self.engine)

    @contextlib.contextmanager
    def _between_steps(self):
        """Hold the engine between two steps, at most one step from now: the loop starts no step
        while a caller waits here."""
        with self._cv:
            self._waiting += 1
        try:
            with self._engine_lock:
                yield
        finally:
            with self._cv:
                self._waiting -= 1
                self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()

    # ---- the loop thread ----------------------------------------------------------------
    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"rollout engine loop failed: {self._error!r}") from self._error

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._stop or (not self._waiting and (self._pending or
                                                                               not self.engine.occupancy.idle)))
                if self._stop:
                    return
                occupancy = self.engine.occupancy
                room = self._cap - occupancy.running - occupancy.queued
                admit = [self._pending.popleft() for _ in range(max(0, min(room, len(self._pending))))]
                self._admitting, epoch = admit, self._epoch
                if self._busy_since is None:
                    self._busy_since = self.clock()
            try:
                with self._engine_lock:
                    if epoch != self._epoch:  # an abort came in between and handed `admit` on
                        continue
                    for request in admit:
                        self.engine.submit(request)
                    self._admitting = []
                    finished = self.engine.step()
                    self.steps += 1
                    with self._cv:  # under the engine lock too: an abort sees all of a step or none
                        if finished and not self._outbox:
                            self._outbox_since = self.clock()
                        self._outbox.extend(finished)
                        self._in_flight -= len(finished)
                        if self._in_flight == 0:
                            self._busy.append((self._busy_since, self.clock()))
                            self._busy_since = None
                        if finished or self._busy_since is None:
                            self._cv.notify_all()
            except BaseException as e:  # noqa: BLE001 - handed to the driver by the next take
                with self._cv:
                    self._error = e
                    self._pending.clear()
                    self._cv.notify_all()
                return
