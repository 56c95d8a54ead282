"""Resume onto another split, onto the colocated loop, and of an async run (issue 11).

A 2+2 run stops after step 1's checkpoint (a dispatcher that raises on step 2's prompts: a crash
between two steps); resumed with split 3+1, or with pipeline.mode=colocated, it ends with the
samples and the model and optimizer bytes of the straight 2+2 run. An async run stopped the same
way resumes from its checkpoint, which kept the resumed step's samples (made with the weights one
version before the checkpoint's: exact staleness), and ends byte-identical to the straight async
run. events.jsonl then holds every sample and step event once.
"""

import shutil

import pytest

from poise.runtime.driver import train_disaggregated
from poise.training.checkpoint import PENDING_SAMPLES
from poise.training.colocated import train_colocated

from fault_runs import CrashAtStep as _CrashAtStep, assert_logged_once, baseline, config, crashed

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def crashed_sync(tmp_path_factory, warm_start):
    """A sync 2+2 run that stopped with checkpoints after steps 0 and 1 (the session's, which
    tests/runtime/test_runtime.py resumes too)."""
    run_dir = crashed("sync", tmp_path_factory.getbasetemp(), warm_start)
    assert (run_dir / "checkpoints/latest").read_text().strip() == "step_000002"
    return run_dir


def _copy(run_dir, where):
    shutil.copytree(run_dir, where)
    return where


@pytest.mark.parametrize("target", ["3+1", "colocated"])
def test_sync_2_2_resumes_onto_another_layout(ray_session, tmp_path, tmp_path_factory, crashed_sync, warm_start,
                                              read_run, target):
    straight = baseline("sync", tmp_path_factory, warm_start, read_run)
    run_dir = _copy(crashed_sync, tmp_path / "run")
    if target == "colocated":
        train_colocated(config(run_dir, warm_start, "pipeline.mode=colocated"), resume=True)
    else:
        train_disaggregated(config(run_dir, warm_start, "pipeline.mode=sync", "cluster.split=[3,1]"), resume=True)
    got = read_run(run_dir)
    got.assert_learned(warm_start)
    straight.assert_learned(warm_start)
    got.assert_bitwise_equal(straight, f"2+2 crashed at step 2, resumed on {target} vs straight 2+2")
    assert_logged_once(got)
    if target == "3+1":
        assert [r["split"] for r in got.rows] == [[2, 2], [2, 2], [3, 1]]


@pytest.fixture(scope="module")
def crashed_sharded(tmp_path_factory, warm_start):
    """A sync 2+2 run with cluster.shard=full that stopped with checkpoints after steps 0 and 1 (the
    writer gathered the weights and the optimizer state from their owners)."""
    return crashed("sync", tmp_path_factory.getbasetemp(), warm_start, "cluster.shard=full")


@pytest.mark.parametrize("target", ["1+3-optimizer", "1+3-full", "colocated"])
def test_sharded_2_2_resumes_onto_another_layout(ray_session, tmp_path, tmp_path_factory, crashed_sharded,
                                                 warm_start, read_run, target):
    """The owners' state, written as one file, reshards on load: onto three owners of the optimizer
    state, onto three owners of the weights too, and onto the colocated loop's one optimizer."""
    straight = baseline("sync", tmp_path_factory, warm_start, read_run)
    run_dir = _copy(crashed_sharded, tmp_path / "run")
    if target == "colocated":
        train_colocated(config(run_dir, warm_start, "pipeline.mode=colocated"), resume=True)
    else:
        train_disaggregated(config(run_dir, warm_start, "pipeline.mode=sync", "cluster.split=[1,3]",
                                   f"cluster.shard={target.split('-')[1]}"), resume=True)
    got = read_run(run_dir)
    got.assert_learned(warm_start)
    got.assert_bitwise_equal(straight, f"sharded 2+2 crashed at step 2, resumed on {target} vs straight 2+2")
    assert_logged_once(got)


def test_async_resume_is_byte_identical(ray_session, tmp_path, tmp_path_factory, warm_start, read_run):
    straight = baseline("async", tmp_path_factory, warm_start, read_run)
    cfg = config(tmp_path, warm_start, "pipeline.mode=async")
    with pytest.raises(RuntimeError, match="simulated crash"):
        # async dispatches step k+1 during step k: step 2's prompts go out during step 1, so this
        # stops in step 1, after step 0's checkpoint
        train_disaggregated(cfg, dispatcher=_CrashAtStep(cfg, 2))
    latest = (tmp_path / "checkpoints/latest").read_text().strip()
    assert (tmp_path / "checkpoints" / latest / PENDING_SAMPLES).is_file(), latest
    train_disaggregated(cfg, resume=True)
    got = read_run(tmp_path)
    got.assert_learned(warm_start)
    straight.assert_learned(warm_start)
    assert {v for _, _, v in got.samples.values()} == {0, 1}  # staleness 1: steps 0 and 1 use v0, step 2 v1
    got.assert_bitwise_equal(straight, "async crashed and resumed vs straight async")
    assert_logged_once(got)
