"""Dynamic sampling keeps the bitwise promise: colocated = sync 1+3 = 3+1.

Groups whose rewards are all equal are dropped and replaced by new draws as soon as they are
scored (here: half the prompts are arithmetic, which the sort-only warm start never solves, so
those groups score all 0); which draws fill the step's slots must not depend on which device generated what, or in
what order groups finished. The runs start from the session's warm start, so weights move every
step (asserted), drop at least one group (asserted, so the replacement path runs), and are
compared by every trained sample's tokens and logprobs and the bytes of model and optimizer
after every step.
"""

import pytest

from poise.config import load_train_config
from poise.runtime.driver import train_disaggregated
from poise.training.colocated import train_colocated

from run_shapes import tiny_job

pytestmark = pytest.mark.ray

STEPS = 2
KNOBS = ["algorithm.dynamic_sampling=true", "data.phases=[{mix: {sort: 0.5, arith: 0.5}}]"]


def _run(train, run_dir, warm_start, read_run, *extra):
    train(load_train_config(None, [*tiny_job(STEPS), f"run.dir={run_dir}", *warm_start.overrides, *KNOBS, *extra]))
    return read_run(run_dir)


def test_dynamic_sampling_bitwise_equal_across_splits(ray_session, tmp_path, warm_start, read_run):
    ref = _run(train_colocated, tmp_path / "colocated", warm_start, read_run, "pipeline.mode=colocated")
    ref.assert_learned(warm_start)
    dropped = [r["dynamic/dropped_groups"] for r in ref.rows]
    assert sum(dropped) > 0, f"no group dropped in {dropped}: the replacement path did not run"
    assert all(r["dynamic/draws"] == 4 + d for r, d in zip(ref.rows, dropped)), ref.rows
    assert all(r["dynamic/unfilled"] == 0 for r in ref.rows), ref.rows
    for split in [(1, 3), (3, 1)]:
        got = _run(train_disaggregated, tmp_path / f"sync-{split[0]}-{split[1]}", warm_start, read_run,
                   "run.verify_sync=true", "pipeline.mode=sync", f"cluster.split=[{split[0]},{split[1]}]")
        got.assert_learned(warm_start)
        got.assert_bitwise_equal(ref, f"dynamic sampling: sync {split} vs colocated")
        assert [r["dynamic/dropped_groups"] for r in got.rows] == dropped
