"""Stopping `poise train` on SIGINT (Ctrl-C) or SIGTERM without losing steps. Torch-free.

While a training loop runs (`with graceful(run_dir):`), the first signal only asks it to stop:
the loop ends the step in progress, writes a checkpoint after it and raises `Stopped`, which the
CLI turns into "resume with: poise train --resume RUN_DIR" and exit 128 + signal (130 or 143).
A second signal, or one before the loop starts (Ray starting, the model loading: nothing to save
yet) or after it ends, stops at once: KeyboardInterrupt for SIGINT, SystemExit(143) for SIGTERM, so
the `finally` blocks still stop the worker actors and the reward sandbox, and nothing is left
running. Each case says its own line: only a second signal says that steps are lost.

Inside `held()` (ray.init: Ray's core worker and its threads half built) a signal is not raised
where it lands but when the section ends: an exception raised inside ray.init left a core worker
that Ray's exit handler then shut down half built, and the interpreter crashed at exit (SIGSEGV),
or Ray caught it and started again.

Signal state is per process by nature, hence module state here. `ray.init` installs its own
SIGTERM handler (sys.exit(15)), so `graceful` installs ours again after Ray has started.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(Exception):
    """The loop stopped at a signal's request after `steps_done` steps, with `checkpoint` after them."""

    def __init__(self, signum: int, steps_done: int, checkpoint: Path):
        super().__init__(f"stopped by {signal.Signals(signum).name} after {steps_done} steps")
        self.signum, self.steps_done, self.checkpoint = signum, steps_done, checkpoint


class _State:
    armed: bool = False  # a loop runs and can stop after its step
    requested: int | None = None  # the first signal received while armed
    run_dir: Path | None = None
    looped: bool = False  # a loop has started in this process: a signal after it ends stops the shut-down
    held: int = 0  # depth of `held()` sections
    pending: int | None = None  # a signal received inside `held()`, raised when it ends
    stopping: bool = False  # a signal stops the process at once, and its line said so


_state = _State()


def requested() -> int | None:
    """The signal that asked the running loop to stop, or None: checked once per step."""
    return _state.requested


def stopped_at_once() -> bool:
    """A signal is stopping this process at once, and said so in a line of its own."""
    return _state.stopping


def _handler(signum: int, frame) -> None:  # noqa: ARG001 - signal.signal's signature
    if _state.armed and _state.requested is None:
        name = signal.Signals(signum).name
        _state.requested = signum
        again = "Ctrl-C" if signum == signal.SIGINT else name
        print(f"poise: {name}: finishing this step and writing a checkpoint; {again} again to stop at once",
              file=sys.stderr, flush=True)
        return
    if _state.held:  # said and raised when the section ends (Ray may be writing to its own log meanwhile)
        _state.pending = _state.pending or signum
        return
    _stop(signum)


def _stop(signum: int) -> None:
    """Say why the process stops now, then stop it: KeyboardInterrupt or SystemExit(128 + signum)."""
    name = signal.Signals(signum).name
    run_dir = _state.run_dir
    saved = run_dir is not None and (run_dir / "checkpoints").is_dir()
    where = f"; resume with: poise train --resume {run_dir}" if saved else ""
    if _state.armed:  # a second signal while the loop runs
        what = "stopping at once (steps since the last checkpoint are lost)"
    elif _state.looped:
        what = "stopping now, as the run shuts down"
    else:
        what = "stopping the start-up" + ("" if saved else " (no step trained yet)")
    print(f"poise: {name}: {what}{where}", file=sys.stderr, flush=True)
    _state.stopping = True
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A section a signal must not interrupt midway (ray.init): a signal inside stops the process
    at the section's end instead of where it lands."""
    _state.held += 1
    try:
        yield
    finally:
        _state.held -= 1
        signum = _state.pending if _state.held == 0 else None
        if signum is not None:
            _state.pending = None
            _stop(signum)


def install(run_dir: Path | None = None) -> None:
    """Handlers for the whole `poise train` process (main thread only): stop at once until a
    loop arms them."""
    if run_dir is not None:
        _state.run_dir = run_dir
    for signum in SIGNALS:
        signal.signal(signum, _handler)


@contextlib.contextmanager
def graceful(run_dir: Path) -> Iterator[None]:
    """Inside: the first signal asks the loop to stop after its step. A process that did not call
    `install` (a test calling the loop directly) keeps its own handlers."""
    if signal.getsignal(signal.SIGINT) is not _handler:
        yield
        return
    install(run_dir)  # again: ray.init replaced the SIGTERM handler
    _state.armed, _state.requested, _state.looped = True, None, True
    try:
        yield
    finally:
        _state.armed = False


class _Teardown:
    """Ctrl-C once the command has returned, while the exit handlers (Ray's shutdown, the reward
    sandbox's) still run: counted, not raised, so the teardown finishes and nothing stays running;
    the process then exits 130. Dying by the signal there instead gave exit status -2 mid-teardown."""

    interrupts = 0

    @classmethod
    def count(cls, signum: int, frame) -> None:  # noqa: ARG003 - signal.signal's signature
        cls.interrupts += 1
        if cls.interrupts > 1:  # a second Ctrl-C: stop now, as during a run
            os._exit(130)

    @classmethod
    def exit_if_interrupted(cls) -> None:
        if cls.interrupts:
            print("poise: interrupted", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)


def command(run: Callable[[], int]) -> int:
    """Run the `poise` program's command (not for in-process callers: it owns SIGINT at exit). Its
    exit handler is registered before any the command registers, so it runs after them."""
    atexit.register(_Teardown.exit_if_interrupted)
    code = run()
    signal.signal(signal.SIGINT, _Teardown.count)
    return code
