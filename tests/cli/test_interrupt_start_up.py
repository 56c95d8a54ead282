"""Ctrl-C at random moments of `poise train`'s start-up (Python importing torch, the reward
sandbox starting, Ray starting, the devices placed, the model loading, the first step): always
exit 130, never a crash, the start-up's own line (not the second Ctrl-C's), nothing left running.

The run is in a session of its own and the signal goes to its whole process group, as a
terminal's Ctrl-C does (Ray's own processes get it too). The moments are drawn with a fixed seed
from 0 s to a little after the first step of an undisturbed run of the same job.
POISE_START_UP_MOMENTS sets how many (default 5; the full check is 20)."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time

import pytest

from start_up_runs import Descendants, train_argv

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RAY_WORKER = re.compile(r"^(\x1b\[\d+m)?\(pid=\d+")  # an actor's output that Ray relays (log_to_driver)
STEPS = 40  # the last moment lands long before the run's natural end, whatever the load does to its speed
MOMENTS = int(os.environ.get("POISE_START_UP_MOMENTS", "5"))


def _start(run_dir) -> subprocess.Popen:
    return subprocess.Popen(train_argv(run_dir, f"run.steps={STEPS}", "run.progress=false"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _first_step_s(tmp_path) -> float:
    """Seconds from the start of an undisturbed run to its first step's metrics row."""
    run_dir = tmp_path / "undisturbed"
    start = time.monotonic()
    proc = _start(run_dir)
    rows = run_dir / "metrics.jsonl"
    while not (rows.is_file() and rows.read_text().strip()):
        assert proc.poll() is None and time.monotonic() - start < 600, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    took = time.monotonic() - start
    os.killpg(proc.pid, signal.SIGINT)  # its first step is all it was for
    proc.communicate(timeout=600)
    assert proc.returncode == 130
    return took


def test_ctrl_c_at_random_moments_of_start_up_exits_130_and_leaves_nothing(tmp_path):
    horizon = _first_step_s(tmp_path) * 1.15
    draw = random.Random(0)  # one moment in each of MOMENTS equal slices of 0..horizon: imports to first step
    moments = [(i + draw.random()) / MOMENTS * horizon for i in range(MOMENTS)]
    outcomes = []
    for i, moment in enumerate(moments):
        proc = _start(tmp_path / f"run{i}")
        started = Descendants(proc.pid)
        deadline = time.monotonic() + moment
        while time.monotonic() < deadline and proc.poll() is None:
            started.record()
            time.sleep(0.02)
        started.record()
        assert proc.poll() is None, f"the run ended before the Ctrl-C at {moment:.2f} s"
        os.killpg(proc.pid, signal.SIGINT)
        try:
            while proc.poll() is None:  # Ray's processes the stop may still start are recorded too
                started.record()
                time.sleep(0.05)
        finally:
            _, err = proc.communicate(timeout=120)
        gone = started.gone_within(30)
        outcomes.append((moment, proc.returncode, gone))
        assert proc.returncode == 130, (moment, proc.returncode, err[-3000:])
        assert "stopping at once" not in err, (moment, err[-2000:])  # the second Ctrl-C's line
        own = "\n".join(line for line in err.splitlines() if not RAY_WORKER.match(line))  # the driver's lines
        assert "Traceback" not in own and "Fatal Python error" not in own, (moment, err[-3000:])
        assert gone, (moment, started.describe())
    print(f"{MOMENTS} moments in 0-{horizon:.1f} s: {outcomes}")
