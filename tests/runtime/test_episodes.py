"""Multi-turn episodes change nothing when devices move: every split, async, a live resize schedule,
a rollout device killed mid-episode and a crashed run resumed onto another split all end with the
colocated loop's episodes (every token, log-prob, loss mask and weights version) and its model and
optimizer bytes after every step.

The job: the built-in `guess` task (env.name: guess; higher/lower feedback, 3 turns at most) from a
warm start that plays it (SFT on transcripts, observations masked), so episodes run 1 to 3 turns,
rewards differ within every group and every step moves the weights (asserted first).
"""

from __future__ import annotations

import pytest

from poise.config import load_train_config
from poise.runtime.driver import train_disaggregated
from poise.training.colocated import train_colocated

from fault_runs import CrashAtStep
from run_shapes import GROUP, PROMPTS, RunMemo, tiny_job

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS = 3
GUESS = "[{mix: {guess: 1.0}}]"
JOB = [*tiny_job(STEPS), "algorithm.sampling.max_new_tokens=4", "env.name=guess", "env.max_turns=3",
       f"data.phases={GUESS}"]
WARM = ["model.tiny.hidden_size=64", "model.tiny.intermediate_size=128", "model.tiny.max_positions=96",
        "model.sft.steps=100", "model.sft.batch_size=16", "model.sft.lr=1e-2", f"data.phases={GUESS}"]


class EpisodeWarmStart:
    """The warm start of this module: the tiny model after a short SFT on guess transcripts."""

    def __init__(self, path):
        self.path = path
        self.overrides = (f"model.path={path}",)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    from poise.training.sft import run_sft

    cfg = load_train_config(None, WARM)
    path = tmp_path_factory.mktemp("episode-warm") / "tiny-guess-sft"
    run_sft(cfg.model, cfg.data, path, threads=1, progress=False)
    return EpisodeWarmStart(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, warm, read_run):
    def config(run_dir, *extra):
        return load_train_config(None, [*JOB, *WARM, *warm.overrides, f"run.dir={run_dir}", *extra])

    return RunMemo(tmp_path_factory.mktemp("episodes"), config, read_run)


def _masks(record) -> dict:
    return {tuple(e["id"]): (e["loss_mask"], e["turns"]) for e in record.events if e["kind"] == "sample"}


@pytest.fixture(scope="module")
def reference(runs, warm):
    ref = runs.get("colocated", train_colocated, "pipeline.mode=colocated")
    ref.assert_learned(warm)
    assert len(ref.samples) == STEPS * PROMPTS * GROUP
    turns = [t for _, t in _masks(ref).values()]
    assert min(turns) == 1 and max(turns) == 3, turns  # episodes of every length: the test could tell
    assert all(0 in m for m, t in _masks(ref).values() if t > 1)  # observations in every multi-turn episode
    assert all(len({e["reward"] for e in ref.events if e["kind"] == "sample" and e["step"] == k}) > 1
               for k in range(STEPS))
    return ref


def _assert_same(record, ref, what):
    record.assert_bitwise_equal(ref, what)
    assert _masks(record) == _masks(ref), what


@pytest.mark.parametrize("split", [(1, 3), (2, 2), (3, 1)], ids=lambda s: f"{s[0]}+{s[1]}")
def test_sync_episodes_equal_the_colocated_loop_for_every_split(ray_session, runs, reference, warm, split):
    record = runs.get(f"sync-{split[0]}-{split[1]}", train_disaggregated, "pipeline.mode=sync",
                      f"cluster.split=[{split[0]},{split[1]}]", "run.verify_sync=true")
    record.assert_learned(warm)
    _assert_same(record, reference, f"sync {split}")


def test_episode_completions_show_the_transcript_the_same_on_a_split(ray_session, runs, reference):
    """completions.jsonl of an episode: its whole transcript, observations marked, each turn the
    decoded tokens of its run of the loss mask; the Ray runtime's rows equal the colocated loop's."""
    from poise.completions import read_completions

    rows = read_completions(reference.run_dir)
    assert [tuple(r["id"]) for r in rows] == [(k, i, 0) for k in range(STEPS) for i in range(PROMPTS)]
    masks = _masks(reference)
    for r in rows:
        mask, turns = masks[tuple(r["id"])]
        runs_of_mask = [m for n, m in enumerate(mask) if n == 0 or mask[n - 1] != m]
        assert [t["role"] for t in r["turns"]] == ["model" if m else "observation" for m in runs_of_mask], r
        assert len([t for t in r["turns"] if t["role"] == "model"]) == turns
        assert r["completion"].count("[observation]") == turns - 1
    assert any(t["role"] == "observation" and t["text"] for r in rows for t in r["turns"])
    record = runs.get("sync-2-2", train_disaggregated, "pipeline.mode=sync", "cluster.split=[2,2]",
                      "run.verify_sync=true")
    assert read_completions(record.run_dir) == rows


def test_async_episodes_are_the_same_on_every_split(ray_session, runs, warm):
    a = runs.get("async-1-3", train_disaggregated, "pipeline.mode=async", "cluster.split=[1,3]")
    b = runs.get("async-3-1", train_disaggregated, "pipeline.mode=async", "cluster.split=[3,1]")
    a.assert_learned(warm)
    _assert_same(a, b, "async 1+3 vs 3+1")
    assert {v for _, _, v in a.samples.values()} == {0, 1}  # step k's episodes under version k - 1 (k >= 1)


def test_a_live_resize_schedule_changes_no_episode(ray_session, runs, reference):
    record = runs.get("resized", train_disaggregated, "pipeline.mode=sync", "cluster.split=[2,2]",
                      "resize.schedule=[{at_step: 1, split: [1, 3]}, {at_step: 2, split: [3, 1]}]")
    assert [r["split"] for r in record.rows] == [[2, 2], [1, 3], [3, 1]]
    _assert_same(record, reference, "live resizes")


def test_a_rollout_device_killed_mid_episode_changes_nothing(ray_session, runs, reference):
    record = runs.get("killed", train_disaggregated, "pipeline.mode=sync", "cluster.split=[2,2]",
                      "cluster.step_timeout_s=60", faults={"kill": "generate:1:0"})
    recoveries = [e for e in record.events if e["kind"] == "recovery"]
    assert [e["devices"] for e in recoveries] == [[0]], recoveries
    _assert_same(record, reference, "a rollout device killed while episodes of step 1 were between turns")


def test_a_crashed_run_resumes_onto_another_split(ray_session, runs, reference, tmp_path):
    run_dir = tmp_path / "crashed"
    cfg = runs.config(run_dir, "pipeline.mode=sync", "cluster.split=[2,2]")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train_disaggregated(cfg, dispatcher=CrashAtStep(cfg, 2))
    assert (run_dir / "checkpoints/latest").read_text().strip() == "step_000002"
    train_disaggregated(runs.config(run_dir, "pipeline.mode=sync", "cluster.split=[3,1]"), resume=True)
    _assert_same(runs.read(run_dir), reference, "crashed on 2+2, resumed on 3+1")
