"""`poise train --resume` from anywhere: the saved config's paths do not depend on the directory the
run started in, and a finished run says so and does nothing."""

import json

import pytest

from cli_checks import poise  # tests/cli_checks.py

RUN = ["pipeline.mode=colocated", "algorithm.prompts_per_step=2", "algorithm.group_size=2",
       "algorithm.micro_batch_size=4", "algorithm.sampling.max_new_tokens=8", "run.progress=false"]


@pytest.fixture
def finished_run(tmp_path):
    """A 1-step run started in `start/` with a relative dataset and run directory."""
    start = tmp_path / "start"
    start.mkdir()
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in ((1, 1), (2, 3))]
    (start / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = poise("train", *RUN, "run.steps=1", "run.dir=runs/r", "data.dataset=rows.jsonl", cwd=start)
    assert result.returncode == 0, result.stderr
    return start / "runs" / "r"


def test_resume_from_another_directory_finds_the_runs_files(tmp_path, finished_run):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = poise("train", "--resume", str(finished_run), "run.steps=2", cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    assert f"poise: 2 steps in {finished_run}" in result.stderr
    assert not (elsewhere / "runs").exists()


def test_resume_of_a_finished_run_says_it_is_done(tmp_path, finished_run):
    events = (finished_run / "events.jsonl").read_text()
    result = poise("train", "--resume", str(finished_run), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "already finished" in lines[0] and "run.steps=" in lines[0], result.stderr
    assert (finished_run / "events.jsonl").read_text() == events  # nothing ran
