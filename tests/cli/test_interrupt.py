"""Ctrl-C and SIGTERM on `poise train` (a real sync run on Ray, in its own process group, so the
signal reaches every process a terminal's Ctrl-C would): the first signal ends the step, writes a
checkpoint and exits 130/143 with the command that resumes; that command resumes from the
checkpoint, says from which step, and continues the run's clock; a second Ctrl-C exits at once.
Nothing is left running in any case."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from poise.training.progress import LINE_EVERY_S
from terminal import as_from_a_terminal, terminal_env

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS = 40  # far more than the test waits for: a stop is never the run's natural end
JOB = ["run.progress=false", f"run.steps={STEPS}", "run.checkpoint_every=0", "pipeline.mode=sync",
       "cluster.devices=2", "cluster.split=[1,1]", "algorithm.prompts_per_step=2", "algorithm.group_size=4",
       "algorithm.micro_batch_size=4", "algorithm.sampling.max_new_tokens=8", "rollout.num_slots=8"]


def _start(run_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "poise", "train", *JOB, f"run.dir={run_dir}", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=terminal_env(), preexec_fn=as_from_a_terminal)


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_for_rows(proc: subprocess.Popen, run_dir: Path, count: int, timeout_s: float = 240.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = len(_rows(run_dir))
        if done >= count:
            return done
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    raise AssertionError(f"the run logged fewer than {count} steps in {timeout_s:g} s")


def _group_gone(pgid: int, timeout_s: float = 30.0) -> bool:
    """Every process of the run's session has ended (Ray's raylet, GCS and workers included)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def _left_running(pgid: int) -> str:
    return subprocess.run(["ps", "-o", "pid,pgid,args", "-g", str(pgid)], capture_output=True, text=True).stdout


def _only_poise_lines(err: str) -> None:
    """The console without a TTY: Poise's own lines and its progress lines, nothing of Ray's."""
    for line in err.splitlines():
        assert line.startswith(("poise: ", "train ")), f"not Poise's: {line!r}\n{err[-3000:]}"


def _latest(run_dir: Path) -> int:
    return int((run_dir / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))


def test_ctrl_c_checkpoints_the_step_and_the_printed_command_resumes(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(run_dir)
    done = _wait_for_rows(proc, run_dir, 3)  # step `done` (counting from 0) is in progress
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert _group_gone(proc.pid), _left_running(proc.pid)
    assert "Traceback" not in err
    saved = _latest(run_dir)
    # the step in progress ended and was saved (or the next, if the signal met the step's end)
    assert done + 1 <= saved <= done + 2 < STEPS, (done, saved, err[-2000:])
    assert len(_rows(run_dir)) == saved  # every step logged is in the checkpoint, no more
    command = re.search(r"resume with: (poise train --resume \S+)", err)
    assert command, err[-2000:]
    assert command.group(1) == f"poise train --resume {run_dir}"

    _only_poise_lines(err)
    assert "Token authentication is enabled" in (run_dir / "ray.log").read_text()  # kept on, said in the log

    argv = shlex.split(command.group(1))
    start = time.monotonic()
    resumed = subprocess.run([sys.executable, "-m", "poise", *argv[1:], "run.progress=true"], capture_output=True,
                             text=True, timeout=600)
    took = time.monotonic() - start
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _only_poise_lines(resumed.stderr)
    progress = [line for line in resumed.stderr.splitlines() if line.startswith("train ")]
    assert len(progress) <= took / LINE_EVERY_S, (took, progress)  # no TTY: a line per 10 s at most
    assert all(re.search(r"steps/s  eta \d+:\d\d$", line) for line in progress), progress
    assert f"resuming {run_dir} from step {saved} (checkpoint step_{saved:06d})" in resumed.stderr
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS))  # each step once, none lost

    # one clock across the resume: each step starts after the one before ends, and every event of
    # the resumed segment comes after the first segment's last
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    steps = sorted((e for e in events if e["kind"] == "step"), key=lambda e: e["step"])
    assert [e["step"] for e in steps] == list(range(STEPS))
    for before, after in zip(steps, steps[1:]):
        assert before["start"] <= before["end"] <= after["start"], (before, after)
    first_end = max(e["end"] for e in steps[:saved])
    later = [e for e in events if isinstance(e.get("step"), int) and e["step"] >= saved and e["kind"] == "interval"]
    assert later and min(e["start"] for e in later) >= first_end

    # and the report draws each step once, in order, on that clock
    from poise.report import draw_report
    from poise.report.timeline import timeline_data

    page = draw_report(run_dir)["html"].read_text()
    assert f"<td>{STEPS} (0-{STEPS - 1})</td>" in page
    drawn = timeline_data(events)["intervals"]
    assert max(iv[2] for iv in drawn if iv[4] < saved) <= min(iv[1] for iv in drawn if iv[4] >= saved)


def test_sigterm_checkpoints_and_exits_143(tmp_path):
    from poise.training.checkpoint import verify_checkpoint

    run_dir = tmp_path / "run"
    proc = _start(run_dir)
    done = _wait_for_rows(proc, run_dir, 2)
    os.kill(proc.pid, signal.SIGTERM)  # a scheduler's stop: to the driver only
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert _group_gone(proc.pid), _left_running(proc.pid)
    saved = _latest(run_dir)
    assert done + 1 <= saved <= done + 2 < STEPS, (done, saved)
    assert verify_checkpoint(run_dir / "checkpoints" / f"step_{saved:06d}") is None  # complete, verifies
    assert f"resume with: poise train --resume {run_dir}" in err


class _Stderr:
    """A run's stderr read line by line on a thread (its stdout drained on another), so a test can
    wait for a line while the run goes on."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(proc.stderr, True), daemon=True),
                         threading.Thread(target=self._read, args=(proc.stdout, False), daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, keep: bool) -> None:
        for line in stream:
            if keep:
                with self._seen:
                    self.lines.append(line)
                    self._seen.notify_all()

    def wait_for(self, text: str, timeout_s: float) -> bool:
        with self._seen:
            return self._seen.wait_for(lambda: any(text in line for line in self.lines), timeout_s)

    def text(self) -> str:
        for reader in self._readers:
            reader.join(timeout=60)
        return "".join(self.lines)


def test_second_ctrl_c_stops_at_once(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(run_dir)
    stderr = _Stderr(proc)
    _wait_for_rows(proc, run_dir, 2)
    os.killpg(proc.pid, signal.SIGINT)
    # the second once the first is seen: two SIGINTs sent before the process runs its handler merge
    # into one pending signal (the kernel keeps one of each), and a loaded machine makes that likely
    assert stderr.wait_for("again to stop at once", 60), stderr.lines[-20:]
    os.killpg(proc.pid, signal.SIGINT)
    start = time.monotonic()
    proc.wait(timeout=120)
    err = stderr.text()
    assert proc.returncode == 130, err[-3000:]
    assert "stopping at once" in err
    assert time.monotonic() - start < 30  # the actors are killed, not waited for
    assert _group_gone(proc.pid), _left_running(proc.pid)


def test_ctrl_c_in_the_colocated_loop_checkpoints_and_resumes(tmp_path):
    """The same contract without Ray: one process, the reference loop."""
    run_dir = tmp_path / "run"
    proc = _start(run_dir, "pipeline.mode=colocated")
    done = _wait_for_rows(proc, run_dir, 2)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    saved = _latest(run_dir)
    assert done + 1 <= saved <= done + 2 < STEPS, (done, saved)
    assert f"resume with: poise train --resume {run_dir}" in err
    resumed = subprocess.run([sys.executable, "-m", "poise", "train", "--resume", str(run_dir), "run.steps=12"],
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {run_dir} from step {saved} (checkpoint step_{saved:06d})" in resumed.stderr
    assert [r["step"] for r in _rows(run_dir)] == list(range(12))
    assert f"poise: 12 steps in {run_dir}" in resumed.stderr  # the whole run's summary, not the segment's


HANG = "import time\n\n\ndef hang(prompts, completions, **kwargs):\n    time.sleep(10 ** 6)\n"


def _sandbox_processes(driver: int) -> list[int]:
    """Processes of the driver's reward sandbox: their working directory is one of its scratch directories."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and f"poise-reward-{driver}-" in os.readlink(f"/proc/{pid}/cwd"):
                found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("mode", ["colocated", "sync"])
def test_a_second_sigterm_stops_within_10_s_while_reward_calls_hang(tmp_path, mode):
    """Both reward workers are inside a call that would hang until reward.timeout_s (30 s): the
    first SIGTERM waits for the step, the second stops at once; nothing of the sandbox (or Ray) is
    left."""
    (tmp_path / "hang.py").write_text(HANG)
    run_dir = tmp_path / "run"
    proc = _start(run_dir, f"pipeline.mode={mode}", "reward.timeout_s=30", "reward.workers=2",
                  f"reward.functions=[{tmp_path}/hang.py:hang]")
    deadline = time.monotonic() + 240
    while len(_sandbox_processes(proc.pid)) < 2 * 3 + 2:  # each worker's 3 processes, and a call process each
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGTERM)
    start = time.monotonic()
    _, err = proc.communicate(timeout=120)
    took = time.monotonic() - start
    assert proc.returncode == 143, err[-3000:]
    assert "stopping at once" in err
    assert took < 10, f"the second SIGTERM took {took:.1f} s to stop the run"
    assert _sandbox_processes(proc.pid) == []
    assert _group_gone(proc.pid), _left_running(proc.pid)
