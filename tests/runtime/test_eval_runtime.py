"""Held-out evaluation on the rollout devices of a Ray run (sync 1+1): its training is that of the
colocated reference without evaluation, bit for bit (every sample's tokens, logprobs and weights
version; the model and optimizer bytes of every checkpoint; sync 1+1 = colocated is the runtime's
own invariant, tests/runtime/test_runtime.py, so one Ray run suffices), and its numbers are those
`poise eval` computes in one process from the same checkpoint (which device ran a request changes
no token)."""

from __future__ import annotations

import json

import pytest

from poise.config import load_train_config
from poise.runtime.driver import train_disaggregated
from poise.training.colocated import train_colocated

pytestmark = pytest.mark.ray

STEPS = 3
RAY = ["pipeline.mode=sync", "cluster.devices=2", "cluster.split=[1,1]", "run.verify_sync=true"]
JOB = [
    "run.progress=false", "run.log_tokens=true", f"run.steps={STEPS}", "run.checkpoint_every=1",
    "algorithm.prompts_per_step=4", "algorithm.group_size=4", "algorithm.micro_batch_size=3",
    "algorithm.sampling.max_new_tokens=12", "rollout.num_slots=8",
]
EVAL = ["eval.every=2", "eval.k=2", "eval.problems=6"]


@pytest.fixture(scope="module")
def runs(ray_session, tmp_path_factory, warm_start, read_run):
    root = tmp_path_factory.mktemp("eval-runtime")
    train_colocated(load_train_config(None, [*JOB, *warm_start.overrides, "pipeline.mode=colocated",
                                             f"run.dir={root / 'off'}"]))
    train_disaggregated(load_train_config(None, [*JOB, *RAY, *warm_start.overrides, *EVAL, f"run.dir={root / 'on'}"]))
    return read_run(root / "off"), read_run(root / "on")


def test_evaluation_on_rollout_devices_changes_no_training_bit(runs, warm_start):
    off, on = runs
    on.assert_learned(warm_start)
    on.assert_bitwise_equal(off, "sync 1+1 with eval vs colocated without")
    assert [r["step"] for r in on.rows if "eval" in r] == [1, 2]
    assert not any("eval" in r for r in off.rows)


def test_rollout_device_eval_equals_poise_eval(runs, tmp_path):
    from poise.cli import main

    _, on = runs
    out = tmp_path / "eval.json"
    assert main(["eval", str(on.run_dir), "--out", str(out)]) == 0  # the newest checkpoint: after the last step
    strip = lambda e: {k: v for k, v in e.items() if k != "seconds"}  # noqa: E731
    assert strip(json.loads(out.read_text())["eval"]) == strip(on.rows[-1]["eval"])
    assert on.rows[-1]["eval"]["greedy"]["reward_mean"] > 0 or on.rows[-1]["eval"]["sampled"]["reward_mean"] > 0
