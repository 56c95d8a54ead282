"""`poise plan --staleness`: the staleness table and its verdicts; bad values are one line, exit 2,
before any simulation."""

from __future__ import annotations

import time

import pytest

from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py


def test_plan_compares_staleness_and_says_which_pays():
    r = poise("plan", "streamrl-pipeline", "--staleness", "0,1,2", "--steps", "30", "--partial-tokens", "4096",
              "--overprovision", "16,32")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["staleness", "window", "extra"])
    rows = [line.split() for line in lines[header + 1: header + 4]]
    assert [row[0] for row in rows] == ["0", "1", "2"]
    assert rows[1][1:3] == ["-", "0"] and rows[1][6] == "1.00x" and rows[1][7] == "0%"
    assert rows[2][1] == "4096" and rows[2][2] in ("16", "32")
    gain2 = float(rows[2][6].rstrip("x"))
    assert gain2 >= 1.2 and int(rows[2][7].rstrip("%")) > 0  # faster, and some tokens 2 versions stale
    assert float(rows[0][6].rstrip("x")) < 1.0  # the sync loop waits for every long tail
    assert any(line.startswith("staleness 2 pays: +") and "window 4096 tokens" in line for line in lines)
    assert any(line.startswith("staleness 0 does not pay: -") for line in lines)
    assert any(line.startswith("most samples/s: staleness 2") for line in lines)


@pytest.mark.parametrize("args,fragments", [
    (["--staleness", "1,x"], ["--staleness", "'1,x'", "comma-separated integers >= 0"]),
    (["--staleness=-1,2"], ["--staleness", "integers >= 0"]),
    (["--staleness", "2", "--partial-tokens", "0"], ["--partial-tokens", "integers >= 1"]),
    (["--partial-tokens", "512"], ["--partial-tokens", "give the staleness values"]),
    (["--staleness", "1,2", "--overprovision", "100"], ["pipeline.overprovision", "got 100", "prompts_per_step (64)"]),
])
def test_bad_staleness_values_are_one_line_before_any_simulation(args, fragments):
    start = time.monotonic()
    r = poise("plan", "streamrl-pipeline", "--steps", "200000", *args)  # a simulation would take many minutes
    assert time.monotonic() - start < 60
    assert_one_line_error(r, *fragments)


def test_simulate_prints_samples_per_second_and_staleness_with_partial_rollouts(tmp_path):
    r = poise("simulate", "streamrl-pipeline", "steps=12", "pipeline.mode=async", "pipeline.max_staleness=2",
              "pipeline.partial_tokens=4096", "pipeline.overprovision=16", f"--out={tmp_path}/run")
    assert r.returncode == 0, r.stderr
    line = next(line for line in r.stdout.splitlines() if "trained samples/s" in line)
    assert "trained tokens by staleness (weights versions): 0 " in line and ", 2 " in line
