"""End to end: a run whose reward function lives in a user file under tmp_path trains through the
reward sandbox, from the session's SFT warm start (tests/conftest.py), in the colocated loop."""

from __future__ import annotations

import json

import pytest

from poise.config import load_train_config
from poise.training.colocated import train_colocated
from user_rewards import BRIEF, ITEMS as USER_ITEMS  # tests/rewards/user_rewards.py

ITEMS = USER_ITEMS  # tests/rewards/user_rewards.py

FAST = ["pipeline.mode=colocated", "run.progress=false", "algorithm.prompts_per_step=4", "algorithm.group_size=4",
        "algorithm.sampling.max_new_tokens=12", "rollout.num_slots=16", "run.checkpoint_every=0", "run.log_tokens=true"]


def _run(run_dir, warm_start, *extra):
    cfg = load_train_config(None, [*FAST, *warm_start.overrides, f"run.dir={run_dir}", *extra])
    return train_colocated(cfg)


def test_user_reward_file_trains_exactly_like_the_builtin(tmp_path, warm_start, read_run):
    (tmp_path / "my_reward.py").write_text(ITEMS)
    user = _run(tmp_path / "user", warm_start, "run.steps=3", f"reward.functions=[{tmp_path}/my_reward.py:sorted_items]")
    builtin = _run(tmp_path / "builtin", warm_start, "run.steps=3")
    assert [r["reward/sorted_items"] for r in user] == [r["reward/task"] for r in builtin]
    assert [r["reward_mean"] for r in user] == [r["reward_mean"] for r in builtin]
    assert any(0 < r["reward_mean"] < 1 for r in user) and all(r["grad_norm"] > 0 for r in user)
    assert [r["reward_failures"] for r in user] == [0, 0, 0]
    a, b = read_run(tmp_path / "user"), read_run(tmp_path / "builtin")
    a.assert_learned(warm_start)
    a.assert_bitwise_equal(b, "user reward file vs built-in")  # the same samples and the same updates


def test_a_failing_reward_is_counted_logged_and_the_run_goes_on(tmp_path, warm_start):
    (tmp_path / "flaky.py").write_text(ITEMS + '''
def flaky(prompts, completions, answer, **kwargs):
    if len(completions[0]) % 3 == 0:
        raise ValueError("no reward for this one")
    return sorted_items(prompts, completions, answer)
''')
    rows = _run(tmp_path / "run", warm_start, "run.steps=2", "reward.fallback=0.0",
                f"reward.functions=[{{fn: '{tmp_path}/flaky.py:flaky'}}, {{fn: exact, weight: 0.5}}]")
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    failures = [e for e in events if e["kind"] == "reward_failure"]
    assert [r["reward_failures"] for r in rows] == [sum(e["step"] == k for e in failures) for k in range(2)]
    assert sum(r["reward_failures"] for r in rows) > 0
    assert {e["function"] for e in failures} == {"flaky"} and {e["reason"] for e in failures} == {
        "ValueError: no reward for this one"}
    assert all(len(e["id"]) == 3 and e["fallback"] == 0.0 for e in failures)
    assert all({"reward/flaky", "reward/exact"} <= set(r) for r in rows)


@pytest.mark.slow
def test_user_reward_rises_over_a_control_that_cannot_learn(tmp_path, warm_start):
    """~30 s: 30 steps of 16 x 8 samples, twice. The reward is one a policy learns fast (shorter
    completions score higher): with the items reward the learner's margin over the control was
    within a seed's noise, and the test passed or failed with the machine's rounding."""
    (tmp_path / "my_reward.py").write_text(BRIEF)
    common = ["run.steps=30", "algorithm.prompts_per_step=16", "algorithm.group_size=8", "algorithm.updates_per_step=2",
              "algorithm.micro_batch_size=32", "algorithm.sampling.max_new_tokens=24",
              f"reward.functions=[{tmp_path}/my_reward.py:brief]"]
    learner = [r["reward_mean"] for r in _run(tmp_path / "learner", warm_start, *common, "algorithm.lr=2e-3")]
    control = [r["reward_mean"] for r in _run(tmp_path / "control", warm_start, *common, "algorithm.lr=1e-12")]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert mean(learner[-10:]) > mean(learner[:10]) + 0.02
    assert mean(learner[-15:]) > mean(control[-15:]) + 0.02


HOSTILE = '''
import math, os, time, zlib

def hostile(prompts, completions, answer, **kwargs):
    """Each sample draws one hostile act by a checksum of its prompt and completion (the same in
    every run); a sixth score normally."""
    kind = zlib.crc32((prompts[0] + completions[0]).encode()) % 6
    if kind == 0:
        time.sleep(10 ** 6)  # never returns
    if kind == 1:
        while True:  # a fork bomb
            try:
                os.fork()
            except OSError:
                pass
    if kind == 2:
        return [math.nan]
    if kind == 3:
        return [1.0, 1.0]  # the wrong count
    if kind == 4:
        raise RuntimeError("hostile")
    return sorted_items(prompts, completions, answer)
'''


def test_hostile_rewards_inside_a_run_are_contained_and_the_run_completes(tmp_path, warm_start, read_run):
    """Every kind of hostile reward, mixed into one training run: each call is stopped or refused,
    counted and logged with its sample id; the run finishes every step with every sample."""
    (tmp_path / "hostile.py").write_text(ITEMS + HOSTILE)
    rows = _run(tmp_path / "run", warm_start, "run.steps=2", "reward.timeout_s=1", "reward.fallback=0.0",
                f"reward.functions=[{tmp_path}/hostile.py:hostile]")
    run = read_run(tmp_path / "run")
    assert len(rows) == 2 and len(run.samples) == 2 * 4 * 4  # nothing lost
    failures = [e for e in run.events if e["kind"] == "reward_failure"]
    assert [r["reward_failures"] for r in rows] == [sum(e["step"] == k for e in failures) for k in range(2)]
    assert len({tuple(e["id"]) for e in failures}) == len(failures)  # one per failed sample
    assert all(e["fallback"] == 0.0 for e in failures)
    reasons = " | ".join(sorted({e["reason"] for e in failures}))
    # the samples of this seed draw every act; each shows up as its own kind of failure
    for fragment in ("timed out", "RuntimeError: hostile", "nan", "returned 2 rewards for 1 completion"):
        assert fragment in reasons, reasons
    assert len(failures) < len(run.samples)  # the others were scored
