"""Ctrl-C at moments of `poise train`'s start-up (Python importing torch, the reward sandbox
starting, Ray starting, the devices placed, the model loading, the first step): always exit 130,
never a crash, the start-up's own line (not the second Ctrl-C's), nothing left running.

The run is in a session of its own and the signal goes to its whole process group, as a
terminal's Ctrl-C does (Ray's own processes get it too). An undisturbed run of the same job times
its phases by the lines it prints as each ends, and is stopped just after its first step (the
last moment). By default one more moment falls in each phase before that, drawn with a fixed seed:
imports, the sandbox and Ray starting; the devices placed and the model loading; the first step.
POISE_START_UP_MOMENTS=N draws N moments instead, one in each of N equal slices from 0 s to a
little after the first step (the full check is 20)."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time

import pytest

from start_up_runs import Descendants, train_argv

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RAY_WORKER = re.compile(r"^(\x1b\[\d+m)?\(pid=\d+")  # an actor's output that Ray relays (log_to_driver)
STEPS = 400  # never the run's natural end, whatever the load does to its speed (every run is stopped sooner)
SWEEP = int(os.environ.get("POISE_START_UP_MOMENTS", "0"))  # 0: a moment in each phase
ENDS = ("poise: reward sandbox and Ray started in", "poise: model loaded on")  # lines that end a phase


class _Run:
    """One `poise train` of STEPS in a session of its own: every process it starts recorded, its
    stderr kept line by line with the second each came (its stdout drained)."""

    def __init__(self, run_dir):
        self.began = time.monotonic()
        self.proc = subprocess.Popen(train_argv(run_dir, f"run.steps={STEPS}", "run.progress=false"),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.started = Descendants(self.proc.pid)
        self.lines: list[tuple[float, str]] = []
        self._readers = [threading.Thread(target=self._read, args=(stream,), daemon=True)
                         for stream in (self.proc.stdout, self.proc.stderr)]
        for reader in self._readers:
            reader.start()

    def _read(self, stream) -> None:
        for line in stream:
            if stream is self.proc.stderr:
                self.lines.append((time.monotonic() - self.began, line.rstrip("\n")))

    def watch_until(self, done) -> None:
        """Record the processes started until `done()`, every 20 ms."""
        while not done() and self.proc.poll() is None:
            self.started.record()
            time.sleep(0.02)
        self.started.record()

    def interrupt(self) -> str:
        """Ctrl-C to the whole session; returns its stderr once it has exited."""
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            while self.proc.poll() is None:  # Ray's processes the stop may still start are recorded too
                self.started.record()
                time.sleep(0.05)
        finally:
            self.proc.wait(timeout=120)
            for reader in self._readers:
                reader.join(timeout=60)
        return "\n".join(line for _, line in self.lines)

    def said(self, start: str) -> float:
        """The second the line beginning with `start` came."""
        when = [t for t, line in self.lines if line.startswith(start)]
        assert when, (start, self.lines)
        return when[0]


def _assert_stopped_cleanly(run: _Run, moment: float) -> None:
    err = run.interrupt()
    gone = run.started.gone_within(30)
    assert run.proc.returncode == 130, (moment, run.proc.returncode, err[-3000:])
    assert "stopping at once" not in err, (moment, err[-2000:])  # the second Ctrl-C's line
    own = "\n".join(line for line in err.splitlines() if not RAY_WORKER.match(line))  # the driver's lines
    assert "Traceback" not in own and "Fatal Python error" not in own, (moment, err[-3000:])
    assert gone, (moment, run.started.describe())


def _undisturbed(tmp_path) -> tuple[list[float], float]:
    """The phases' ends (seconds from the start) and the first step's, of a run stopped just after
    its first step's metrics row, which must stop as cleanly as any."""
    run = _Run(tmp_path / "undisturbed")
    rows = tmp_path / "undisturbed" / "metrics.jsonl"
    run.watch_until(lambda: (rows.is_file() and rows.read_text().strip()) or time.monotonic() - run.began > 600)
    first_step = time.monotonic() - run.began
    assert run.proc.poll() is None and rows.is_file(), run.lines[-30:]
    _assert_stopped_cleanly(run, first_step)
    ends = [run.said(end) for end in ENDS]
    assert ends == sorted(ends) and ends[-1] < first_step, (ends, first_step, run.lines)
    return ends, first_step


def _moments(ends: list[float], first_step: float) -> list[float]:
    draw = random.Random(0)
    if SWEEP:  # one moment in each of SWEEP equal slices of 0..a little after the first step
        horizon = first_step * 1.15
        return [(i + draw.random()) / SWEEP * horizon for i in range(SWEEP)]
    bounds = [0.0, *ends, first_step]  # one moment inside each phase
    return [a + draw.random() * (b - a) for a, b in zip(bounds, bounds[1:])]


def test_ctrl_c_at_moments_of_start_up_exits_130_and_leaves_nothing(tmp_path):
    ends, first_step = _undisturbed(tmp_path)
    moments = _moments(ends, first_step)
    for i, moment in enumerate(moments):
        run = _Run(tmp_path / f"run{i}")
        run.watch_until(lambda: time.monotonic() - run.began >= moment)
        assert run.proc.poll() is None, f"the run ended before the Ctrl-C at {moment:.2f} s"
        _assert_stopped_cleanly(run, moment)
    print(f"phases ended at {[round(t, 1) for t in ends]} s, the first step at {first_step:.1f} s; "
          f"Ctrl-C at {[round(t, 1) for t in moments]} s and after the first step")
