"""The Ray driver scores through the reward sandbox as batches arrive (docs/design.md, Rewards): a user
reward file gives a sync run the same samples, rewards and updates as the colocated reference,
an async run reports every function's mean and the failures, and no sandbox process outlives
the run."""

from __future__ import annotations

import json
import os

import pytest

from poise.config import load_train_config
from poise.runtime.driver import train_disaggregated
from poise.training.colocated import train_colocated
from user_rewards import FLAKY, ITEMS as USER_ITEMS  # tests/rewards/user_rewards.py

pytestmark = pytest.mark.ray

ITEMS = USER_ITEMS + FLAKY

TINY = ["run.progress=false", "run.log_tokens=true", "run.steps=2", "run.checkpoint_every=1",
        "algorithm.prompts_per_step=4", "algorithm.group_size=4", "algorithm.micro_batch_size=4",
        "algorithm.sampling.max_new_tokens=12", "rollout.num_slots=8", "cluster.devices=2", "cluster.split=[1,1]"]


@pytest.fixture(scope="module")
def ray_session():
    from poise.runtime.cluster import start_local  # first: it puts Ray in loopback-only mode

    import ray

    start_local(num_cpus=8)  # or join the session's, made by another module
    yield ray


def _sandbox_processes() -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if f"poise-reward-{os.getpid()}-" in os.readlink(f"/proc/{pid}/cwd"):  # this process's pools
                    out.append(int(pid))
            except OSError:
                continue
    return out


def test_sync_with_a_user_reward_equals_colocated(ray_session, tmp_path, warm_start, read_run):
    (tmp_path / "r.py").write_text(ITEMS)
    cfg = [*TINY, *warm_start.overrides, f"reward.functions=[{tmp_path}/r.py:sorted_items]"]
    before = set(_sandbox_processes())
    train_disaggregated(load_train_config(None, [*cfg, f"run.dir={tmp_path}/sync", "pipeline.mode=sync"]))
    assert set(_sandbox_processes()) <= before  # the run's reward workers ended with it
    train_colocated(load_train_config(None, [*cfg, f"run.dir={tmp_path}/colocated", "pipeline.mode=colocated"]))
    sync, colocated = read_run(tmp_path / "sync"), read_run(tmp_path / "colocated")
    sync.assert_learned(warm_start)
    sync.assert_bitwise_equal(colocated, "sync vs colocated, user reward file")
    assert [r["reward/sorted_items"] for r in sync.rows] == [r["reward/sorted_items"] for r in colocated.rows]
    assert [r["reward_failures"] for r in sync.rows] == [0, 0]


def test_async_reports_functions_and_failures(ray_session, tmp_path, warm_start):
    (tmp_path / "r.py").write_text(ITEMS)
    run = tmp_path / "async"
    rows = train_disaggregated(load_train_config(None, [
        *TINY, *warm_start.overrides, f"run.dir={run}", "pipeline.mode=async",
        f"reward.functions=[{{fn: '{tmp_path}/r.py:flaky'}}, {{fn: exact, weight: 0.5}}]"]))
    failures = [e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines())
                if e["kind"] == "reward_failure"]
    assert [r["reward_failures"] for r in rows] == [sum(e["step"] == k for e in failures) for k in range(2)]
    assert sum(r["reward_failures"] for r in rows) > 0
    assert all({"reward/flaky", "reward/exact"} <= set(r) for r in rows)
    assert {tuple(e["id"])[0] for e in failures} <= {0, 1} and {e["function"] for e in failures} == {"flaky"}
