"""`poise completions RUN_DIR [--step N] [--last K]`: what the model wrote, readable in a terminal;
bad input is one line naming the value and the fix."""

from __future__ import annotations

from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py
from poise.runlog import RunLog


def _row(step, i, completion, reward=0.5):
    return {"step": step, "id": [step, i, 0], "prompt_id": f"p-{i}", "prompt": f"arith {i}+{step}",
            "completion": completion, "reward": reward, "rewards": {"task": reward, "format": 1.0}, "length": 7,
            "finish_reason": "eos", "weights_version": step, "truncated": False}


def _run_dir(tmp_path):
    with RunLog(tmp_path) as log:
        for step in range(3):
            log.completions([_row(step, 0, f"answer {step}\nsecond line"), _row(step, 1, f"other {step}", 0.0)])
            log.metrics({"step": step})
    return tmp_path


def test_the_last_step_by_default_then_a_chosen_step_or_the_last_k(tmp_path):
    run = _run_dir(tmp_path)
    out = poise("completions", str(run))
    assert out.returncode == 0, out.stderr
    assert "== step 2 ==" in out.stdout and "step 1" not in out.stdout
    assert "-- sample 2/0/0 (prompt p-0): reward 0.5 (task 0.5, format 1), 7 tokens, finished: eos" in out.stdout
    assert "  prompt:\n    arith 0+2\n  completion:\n    answer 2\n    second line\n" in out.stdout
    assert "other 2" in out.stdout
    one = poise("completions", str(run), "--step", "1").stdout
    assert "== step 1 ==" in one and "answer 1" in one and "answer 2" not in one and "answer 0" not in one
    two = poise("completions", str(run), "--last", "2").stdout
    assert two.index("== step 1 ==") < two.index("== step 2 ==") and "answer 0" not in two


def test_bad_input_is_one_line(tmp_path):
    run = _run_dir(tmp_path / "run")
    assert_one_line_error(poise("completions", str(run), "--step", "9"), "--step 9", "steps 0-2")
    assert_one_line_error(poise("completions", str(run), "--last", "0"), "--last 0", ">= 1")
    assert_one_line_error(poise("completions", str(tmp_path / "nowhere")), "is not a directory")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(poise("completions", str(tmp_path / "empty")), "no completions",
                          "run.log_completions")
    with open(run / "completions.jsonl", "a") as f:
        f.write('{"step": 3, "id": [3, 0')  # a run killed mid-write
    assert_one_line_error(poise("completions", str(run)), "malformed line", "remove the last line")
