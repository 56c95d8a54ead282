"""What `poise train` says before its first progress line: a few short lines naming each phase of
the start-up (Ray, the devices placed, the model loaded, the first step), on a terminal and in a
pipe alike, in the disaggregated and the colocated mode; the reward sandbox's cgroup details in
the run directory, never on the console (where the default defence holds)."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from poise import start_up

from start_up_runs import console_lines, train_argv

pytestmark = [pytest.mark.ray, pytest.mark.slow]

MAX_LINES = 6
PROGRESS = re.compile(r"^train\b.*\d+/\d+")  # the bar on a terminal, `train 3/40 ...` in a pipe
DONE = re.compile(r"^train\b.*\b[1-9]\d*/\d+")  # progress: a step done (a terminal's bar shows 0/N from the start)
LAST = re.compile(r"^poise: \d+ steps? in ")  # the run's last line: a short run may show no progress line


def _before_progress(lines: list[str]) -> list[str]:
    """The lines before the first that shows a step done, less a terminal's bar at 0/N."""
    for i, line in enumerate(lines):
        if DONE.match(line) or LAST.match(line):
            return [x for x in lines[:i] if not PROGRESS.match(x)]
    raise AssertionError(f"no progress line and no last line: {lines}")


def _check_summary(lines: list[str], phases: list[str]) -> None:
    summary = _before_progress(lines)
    assert 1 <= len(summary) <= MAX_LINES, summary
    assert all(len(line) <= start_up.MAX_LINE for line in summary), summary
    assert all(line.startswith("poise: ") for line in summary), summary
    said = iter(summary)  # each phase once, in order
    for phase in phases:
        assert any(phase in line for line in said), (phase, summary)
    console = "\n".join(lines)
    assert "cgroup v1 of its own" not in console and "/sys/fs/cgroup" not in console, console


def _check_run_dir(run_dir) -> None:
    log = (run_dir / start_up.LOG).read_text()
    assert "poise: reward sandbox: " in log, log  # the layer that holds, with its paths and limits
    assert "first step done" in log


DISAGGREGATED = ["reward sandbox and Ray started", "devices placed (1 rollout, 1 train)", "model loaded on 2 devices", "first step done"]


def test_without_a_terminal_a_few_short_lines_name_each_phase(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run(train_argv(run_dir, "run.steps=1"), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_summary(done.stderr.splitlines(), DISAGGREGATED)
    _check_run_dir(run_dir)


def test_on_a_terminal_the_same_lines_come_before_the_bar(tmp_path):
    run_dir = tmp_path / "run"
    leader, follower = os.openpty()
    env = {**os.environ, "COLUMNS": "150", "TERM": "xterm"}
    proc = subprocess.Popen(train_argv(run_dir, "run.steps=1"), stdin=subprocess.DEVNULL, stdout=follower,
                            stderr=follower, env=env)
    os.close(follower)
    chunks, deadline = [], time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal's last writer has gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    lines = console_lines(b"".join(chunks).decode(errors="replace"))
    assert any(PROGRESS.match(line) for line in lines), lines  # a terminal: the live bar
    _check_summary(lines, DISAGGREGATED)
    _check_run_dir(run_dir)


def test_the_colocated_mode_says_the_same_without_ray(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run(train_argv(run_dir, "run.steps=1", "pipeline.mode=colocated"), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_summary(done.stderr.splitlines(), ["reward sandbox started, model loaded on cpu (colocated",
                                              "first step done"])
    assert "Ray started" not in done.stderr
    _check_run_dir(run_dir)
