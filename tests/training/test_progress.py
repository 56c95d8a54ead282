"""Progress without a terminal (CI, pipes, log files): a line per LINE_EVERY_S at most, each with
the rate and the time left."""

import re

from poise.training import progress
from poise.training.progress import LINE_EVERY_S, StepProgress


def test_a_line_per_ten_seconds_with_rate_and_eta(monkeypatch, capsys):
    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    with StepProgress("sft", 300, completed=0) as bar:
        assert not bar.tty  # pytest captures stderr: the non-terminal path
        for _ in range(300):  # 300 steps of 0.25 s: 75 s
            clock[0] += 0.25
            bar.advance(loss=1.5)
    lines = capsys.readouterr().err.splitlines()
    assert 75 / LINE_EVERY_S - 1 <= len(lines) <= 75 / LINE_EVERY_S
    first = lines[0]
    assert first.startswith("sft 40/300  loss 1.5  4 steps/s  eta 1:05"), first
    assert all(re.search(r"\d+/300 .* steps/s  eta \d+:\d\d$", line) for line in lines)


def test_a_resumed_run_rates_its_own_steps(monkeypatch, capsys):
    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    with StepProgress("train", 200, completed=150) as bar:
        for _ in range(20):  # 2 steps/s in this process, not 170 steps in 10 s
            clock[0] += 0.5
            bar.advance()
    line = capsys.readouterr().err.splitlines()[0]
    assert line.startswith("train 170/200") and "2 steps/s  eta 0:15" in line, line
