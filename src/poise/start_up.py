"""What a training run says while it starts: a few short lines, then the progress display. Torch-free.

`poise train` is silent for tens of seconds otherwise (Ray, placing the devices, building the model
on each, the first step). Each phase says one line when it ends, at most once per run:

    poise: reward sandbox and Ray started in 6.3 s
    poise: 4 devices placed (2 rollout, 2 train) in 0.5 s
    poise: model loaded on 4 devices in 7.9 s
    poise: first step done in 5.1 s

No line comes before Ray has started (colocated: before the model has loaded), so an input error
found up to there is still the run's only line.

The details a user rarely needs (the reward sandbox's cgroup paths and limits, each phase's
timing) go to RUN_DIR/start_up.log; the console gets one short line of the sandbox only where its
defence is weaker than the default (no per-worker cgroup: memory limits hold per process).

The report is per process, as a process runs one training at a time (like poise.interrupt's
signal state): `begin` opens it; the phases' calls elsewhere say nothing when no report is open
(a test calling the runtime directly, `poise eval`) or once the first step is done.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

LOG = "start_up.log"  # in the run directory
MAX_LINE = 120  # a console line of the start-up summary is never longer


class _Report:
    run_dir: Path | None = None
    open: bool = False
    said: set[str] = set()
    last: float = 0.0  # when the phase before ended (time.monotonic)


_report = _Report()


def begin(run_dir: Path) -> None:
    """A training run starts: the phases below speak until its first step is done."""
    _report.run_dir, _report.open, _report.said, _report.last = run_dir, True, set(), time.monotonic()
    _write(f"start-up of {run_dir}")


def end() -> None:
    """The run is over (or failed while starting): later calls say nothing and write nothing."""
    _report.open, _report.run_dir = False, None


def phase(name: str, what: str) -> None:
    """Phase `name` ended: one console line `poise: {what} in X s`, once per run."""
    if not _report.open or name in _report.said:
        return
    _report.said.add(name)
    now = time.monotonic()
    line = f"poise: {what} in {now - _report.last:.1f} s"
    _report.last = now
    _say(line)


def first_step() -> None:
    """The first step of this process is done: the last line of the start-up; the progress display
    (a bar on a terminal, a line every 10 s without one) says the rest."""
    if not _report.open:
        return
    phase("first step", "first step done")
    _report.open = False


def sandbox(details: str, weaker: str | None) -> None:
    """The reward sandbox's confinement, said once by the pool: `details` (cgroup paths and limits)
    to the run directory, `weaker` (a short line, only where a defence is weaker than the default)
    to the console too, whether or not a run's report is open (`poise eval` has none)."""
    _write(details)
    if weaker is not None:
        _say(weaker)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
    _write(line)


def _write(line: str) -> None:
    """Append `line` to RUN_DIR/start_up.log (with the wall-clock time) while a run has one."""
    if _report.run_dir is None:
        return
    try:
        with open(_report.run_dir / LOG, "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
    except OSError:  # the run directory is gone (a test's tmp path): the console line stands alone
        pass
