"""Helpers of the start-up tests (tests/cli/test_start_up_lines.py, test_interrupt_start_up.py):
a small `poise train` in its own session, and every process it started, found through /proc."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

# the built-in tasks and tiny model, small: each step takes about a second on a busy 2-core machine
TINY = ["cluster.devices=2", "cluster.split=[1,1]", "algorithm.prompts_per_step=2", "algorithm.group_size=4",
        "algorithm.micro_batch_size=4", "algorithm.sampling.max_new_tokens=8", "rollout.num_slots=8",
        "run.checkpoint_every=0"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def train_argv(run_dir, *extra: str) -> list[str]:
    return [sys.executable, "-m", "poise", "train", *TINY, f"run.dir={run_dir}", *extra]


def _table() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, session id, start time) of every process now."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[int(entry)] = (int(fields[1]), int(fields[3]), int(fields[19]))
    return out


class Descendants:
    """Every process started from `root` (its session, or a parent chain up to it), recorded by
    pid and start time so that a reused pid is not taken for a leftover."""

    def __init__(self, root: int):
        self.root, self.seen = root, {}

    def record(self) -> None:
        table = _table()
        for _ in range(3):  # a chain of parents recorded in the same pass
            for pid, (ppid, sid, start) in table.items():
                if pid == self.root or sid == self.root or ppid in self.seen:
                    self.seen.setdefault(pid, start)

    def alive(self) -> list[int]:
        table = _table()
        return [pid for pid, start in self.seen.items() if pid in table and table[pid][2] == start
                and not _zombie(pid)]

    def gone_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not self.alive():
                return True
            time.sleep(0.2)
        return not self.alive()

    def describe(self) -> str:
        return subprocess.run(["ps", "-o", "pid,ppid,sid,args", "-p", ",".join(map(str, self.alive())) or "1"],
                              capture_output=True, text=True).stdout


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def console_lines(text: str) -> list[str]:
    """What a terminal shows, line by line: escape sequences dropped, carriage returns end lines."""
    return [line.strip() for line in re.split(r"[\r\n]+", ANSI.sub("", text)) if line.strip()]
