"""Partial rollouts with bounded staleness and over-provisioning change no bit across splits,
resizes and a crash (docs/partial-rollouts.md).

From the session's SFT warm start (rewards differ within groups, every step moves the weights),
4 async steps with max_staleness 2, windows of 4 tokens out of 16 and one prompt group over-
provisioned: samples keep generating across weight updates, so their tokens carry several
versions. The runs on 2+2, 1+3, 3+1, a live resize schedule and a 2+2 run crashed mid-step and
resumed on 3+1 end with the same samples (tokens, behaviour log-probs, per-token versions) and the
same model and optimizer bytes. Staleness 0 is the sync loop and staleness 1 without partial
rollouts today's async loop, byte for byte. Each run is made once per module.
"""

import pytest

from poise.config import load_train_config
from poise.runtime import partial
from poise.runtime.driver import train_disaggregated
from poise.runtime.partial import PARTIAL_POOL
from poise.training.checkpoint import PENDING_SAMPLES, decode_samples

from fault_runs import baseline, config
from run_shapes import GROUP, PROMPTS, RunMemo, tiny_job

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS = 4
PARTIAL = [
    *tiny_job(STEPS),
    "run.verify_sync=true",
    "pipeline.mode=async",
    "algorithm.old_logprobs=recompute",
    "algorithm.rollout_is=token",
    "algorithm.sampling.max_new_tokens=16",
    "pipeline.max_staleness=2",
    "pipeline.partial_tokens=4",
    "pipeline.overprovision=1",
]
SCHEDULE = "resize.schedule=[{at_step: 1, split: [1, 3]}, {at_step: 3, split: [2, 2]}]"


def _versions(record) -> dict:
    """Each sample's per-token weights versions, from its event."""
    return {tuple(e["id"]): e["token_versions"] for e in record.events if e["kind"] == "sample"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, warm_start, read_run):
    def config(run_dir, *extra):
        return load_train_config(None, [*PARTIAL, f"run.dir={run_dir}", *warm_start.overrides, *extra])

    return RunMemo(tmp_path_factory.mktemp("partial"), config, read_run)


@pytest.fixture(scope="module")
def base(runs, warm_start):
    """2+2, which must learn, carry samples across updates and train tokens two versions old."""
    got = runs.get("2+2", train_disaggregated, "cluster.split=[2,2]")
    got.assert_learned(warm_start)
    assert len(got.samples) == STEPS * PROMPTS * GROUP
    versions = _versions(got)
    assert any(len(set(v)) > 1 for v in versions.values())  # a sample made under two weights versions
    assert sum(r.get("partial/staleness_2", 0) for r in got.rows) > 0
    assert sum(r["partial/carried_groups"] for r in got.rows) > 0
    assert all(r["partial/overprovisioned_groups"] == 1 for r in got.rows)
    for (step, _, _), v in versions.items():
        assert all(0 <= step - x <= 2 for x in v), (step, v)  # no trained token lags more than 2 versions
    return got


def _assert_same(got, base, what: str) -> None:
    got.assert_bitwise_equal(base, what)
    assert _versions(got) == _versions(base), what
    keys = [k for k in base.rows[0] if k.startswith("partial/")]
    assert [{k: r.get(k) for k in keys} for r in got.rows] == [{k: r.get(k) for k in keys} for r in base.rows]


@pytest.mark.parametrize("split", [(1, 3), (3, 1)], ids=lambda s: f"{s[0]}+{s[1]}")
def test_partial_rollouts_are_bitwise_identical_across_splits(ray_session, runs, base, warm_start, split):
    got = runs.get(f"{split[0]}+{split[1]}", train_disaggregated, f"cluster.split=[{split[0]},{split[1]}]")
    got.assert_learned(warm_start)
    _assert_same(got, base, f"partial rollouts on {split} vs 2+2")


def test_a_live_resize_schedule_changes_nothing(ray_session, runs, base, warm_start):
    got = runs.get("resized", train_disaggregated, "cluster.split=[3,1]", SCHEDULE, "resize.staging_mb=0.05")
    got.assert_learned(warm_start)
    assert [r["split"] for r in got.rows] == [[3, 1], [1, 3], [1, 3], [2, 2]]
    _assert_same(got, base, "partial rollouts under 3+1 -> 1+3 -> 2+2 vs 2+2")


def test_a_crash_mid_step_resumes_on_another_split_with_its_unfinished_samples(ray_session, tmp_path, base,
                                                                                 warm_start, read_run, monkeypatch):
    cfg = [*PARTIAL, f"run.dir={tmp_path}", *warm_start.overrides]
    run_window = partial.PartialPool.run_window
    windows = []

    def crash_in_step_2s_phase(pool, step, version):
        windows.append(step)
        if windows.count(2) == 2:  # the generation of step 2, during step 1, one window in
            raise RuntimeError("simulated crash")
        return run_window(pool, step, version)

    monkeypatch.setattr(partial.PartialPool, "run_window", crash_in_step_2s_phase)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_disaggregated(load_train_config(None, [*cfg, "cluster.split=[2,2]"]))
    monkeypatch.setattr(partial.PartialPool, "run_window", run_window)
    latest = tmp_path / "checkpoints" / (tmp_path / "checkpoints/latest").read_text().strip()
    assert latest.name == "step_000001"
    pool = [s for s, _ in decode_samples(latest / PARTIAL_POOL)]
    assert any(s.finish_reason == "abort" and s.token_ids for s in pool)  # unfinished samples, kept
    assert (latest / PENDING_SAMPLES).is_file()
    train_disaggregated(load_train_config(None, [*cfg, "cluster.split=[3,1]"]), resume=True)
    got = read_run(tmp_path)
    got.assert_learned(warm_start)
    _assert_same(got, base, "partial rollouts crashed in step 1 on 2+2, resumed on 3+1 vs straight 2+2")


@pytest.mark.parametrize("staleness, reference", [(0, "sync"), (1, "async")])
def test_staleness_0_is_sync_and_1_is_todays_async(ray_session, tmp_path, tmp_path_factory, warm_start, read_run,
                                                  staleness, reference):
    want = baseline(reference, tmp_path_factory, warm_start, read_run)
    train_disaggregated(config(tmp_path, warm_start, "pipeline.mode=async", f"pipeline.max_staleness={staleness}"))
    got = read_run(tmp_path)
    got.assert_learned(warm_start)
    got.assert_bitwise_equal(want, f"async with max_staleness {staleness} vs {reference}")
