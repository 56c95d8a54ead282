"""`poise simulate|plan|sweep|report`: bad input is one line and exit 2, never a traceback."""

from __future__ import annotations

import json

from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py


def test_unknown_scenario():
    assert_one_line_error(poise("simulate", "dynaresize-9xh20"), "unknown scenario 'dynaresize-9xh20'",
                          "dynaresize-8xh20")


def test_split_with_zero_devices_in_a_role():
    assert_one_line_error(poise("simulate", "dynaresize-8xh20", "split=[8,0]"), "split", "train has 0 devices")


def test_negative_cooldown():
    assert_one_line_error(poise("simulate", "dynaresize-8xh20", "controller.cooldown_steps=-3"),
                          "controller.cooldown_steps", "got -3")


def test_trace_with_negative_length(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text(json.dumps({"prompt_id": "a", "step": 0, "output_length": 12}) + "\n"
                     + json.dumps({"prompt_id": "b", "step": 0, "output_length": -5}) + "\n")
    assert_one_line_error(poise("simulate", "streamrl-skew", f"workload.trace={trace}", f"--out={tmp_path}/run"),
                          "bad.jsonl:2", "output_length -5")


def test_report_of_a_missing_run(tmp_path):
    assert_one_line_error(poise("report", str(tmp_path / "nothing")), "not a run directory")


def test_simulate_plan_sweep_report_end_to_end(tmp_path):
    out = tmp_path / "run"
    r = poise("simulate", "dynaresize-8xh20", "steps=30", f"--out={out}", "--report")
    assert r.returncode == 0, r.stderr
    assert "resize at step" in r.stdout and (out / "report" / "index.html").is_file()
    r = poise("plan", "dynaresize-8xh20", "--steps", "100")
    assert r.returncode == 0, r.stderr
    assert "recommended static split: 4:4" in r.stdout and "live resizing" in r.stdout
    r = poise("sweep", "dynaresize-8xh20", "steps=30", "--param", "controller.consecutive=1,3",
              f"--out={tmp_path}/sweep")
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["rows"]
    assert [row["params"]["controller.consecutive"] for row in rows] == [1, 3]
    assert (tmp_path / "sweep" / "sweep.png").stat().st_size > 1000


def test_sweep_bad_key_fails_before_any_simulation(tmp_path):
    """A long scenario: had the static baseline run first, this would take minutes."""
    import time

    start = time.monotonic()
    r = poise("sweep", "dynaresize-8xh20", "steps=200000", "--param", "controller.threshhold=0.1,0.3",
              f"--out={tmp_path}/sweep")
    assert time.monotonic() - start < 30
    assert_one_line_error(r, "--param controller.threshhold", "did you mean 'threshold'")
    assert r.stdout == ""  # no simulation, not even the static baseline, printed anything
    r = poise("sweep", "dynaresize-8xh20", "steps=200000", "--param", "threshold=fast", f"--out={tmp_path}/sweep")
    assert_one_line_error(r, "controller.threshold")  # a bad value too


def test_sweep_takes_the_short_names_of_its_help(tmp_path):
    r = poise("sweep", "--help")
    assert "threshold = controller.threshold" in " ".join(r.stdout.split())
    r = poise("sweep", "dynaresize-8xh20", "steps=30", "--param", "threshold=0.05,0.3", f"--out={tmp_path}/sweep")
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["rows"]
    assert [row["params"]["controller.threshold"] for row in rows] == [0.05, 0.3]
