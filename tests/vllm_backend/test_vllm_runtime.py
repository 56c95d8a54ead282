"""`rollout.backend: vllm` in the Ray runtime: a sync 1+1 run and a live-resize run complete, from
the session's SFT warm start (rewards differ within groups, so the weights move).

- sync 1+1 with `old_logprobs: recompute` and `rollout_is: token`: every step trains on a
  non-zero gradient and moves the weights; step k's samples carry weights version k (vLLM took
  each sync); the mismatch metrics are in every step row, and non-zero (vLLM's kernels are not the
  trainer's).
- live resize 2+1 -> 1+2 -> 2+1: a rollout device leaves (its vLLM is aborted, its partial samples
  resume on the other instance, its vLLM shut down) and comes back (vLLM starts again on the
  weights it holds); every sample id of every step is trained once.

Runs where vLLM is installed: `make test-vllm` (.venv-vllm)."""

from __future__ import annotations

import pytest

from poise.config import load_train_config
from poise.runtime.driver import train_disaggregated

pytestmark = pytest.mark.ray

PROMPTS, GROUP = 4, 4
JOB = ["run.progress=false", "run.log_tokens=true", "run.checkpoint_every=1", f"algorithm.prompts_per_step={PROMPTS}",
       f"algorithm.group_size={GROUP}", "algorithm.micro_batch_size=4", "algorithm.sampling.max_new_tokens=12",
       "rollout.num_slots=8", "rollout.backend=vllm", "determinism=semantic", "pipeline.mode=sync"]


def _run(run_dir, warm_start, read_run, *extra):
    train_disaggregated(load_train_config(None, [*JOB, f"run.dir={run_dir}", *warm_start.overrides, *extra]))
    return read_run(run_dir)


def _assert_every_sample_once(record, steps: int) -> None:
    expected = {(k, i, j) for k in range(steps) for i in range(PROMPTS) for j in range(GROUP)}
    assert set(record.samples) == expected
    for (step, _, _), (tokens, logprobs, version) in record.samples.items():
        assert len(tokens) == len(logprobs) >= 1
        assert version == step, f"a sample of step {step} was generated under weights version {version}"


def test_sync_1_1_with_vllm_trains_and_measures_the_mismatch(ray_session, tmp_path, warm_start, read_run):
    steps = 2
    record = _run(tmp_path / "run", warm_start, read_run, f"run.steps={steps}", "cluster.devices=2",
                  "cluster.split=[1,1]", "algorithm.old_logprobs=recompute", "algorithm.rollout_is=token")
    record.assert_learned(warm_start)
    _assert_every_sample_once(record, steps)
    for row in record.rows:
        assert row["mismatch/logp_abs_diff_mean"] > 0, row  # another kernel: never exactly the trainer's
        assert row["mismatch/logp_abs_diff_max"] >= row["mismatch/logp_abs_diff_mean"]
        assert row["mismatch/ratio_p05"] <= row["mismatch/ratio_p50"] <= row["mismatch/ratio_p95"]
        assert 0 < row["mismatch/is_weight_mean"] <= 2.0


def test_live_resize_with_vllm_moves_devices_both_ways(ray_session, tmp_path, warm_start, read_run):
    steps = 3
    record = _run(tmp_path / "run", warm_start, read_run, f"run.steps={steps}", "cluster.devices=3",
                  "cluster.split=[2,1]", "resize.mode=live",
                  "resize.schedule=[{at_step: 1, split: [1, 2]}, {at_step: 2, split: [2, 1]}]")
    record.assert_learned(warm_start)
    _assert_every_sample_once(record, steps)
    assert [r["split"] for r in record.rows] == [[2, 1], [1, 2], [2, 1]]
    resizes = [e for e in record.events if e["kind"] == "resize"]
    assert [(e["mode"], e["to_train"], e["to_rollout"]) for e in resizes] == [("live", [1], []), ("live", [], [1])]


def test_async_with_a_device_joining_as_a_vllm_instance(ray_session, tmp_path, warm_start, read_run):
    """Async (step k's samples from weights version k-1) on a 1+1 pool that a reserve device joins
    after step 0 as a second vLLM instance (elastic scale-out): in async it generates from step 3 on
    (step 1's samples were made during step 0, step 2's are being made when it joins)."""
    steps = 4
    record = _run(tmp_path / "run", warm_start, read_run, f"run.steps={steps}", "cluster.devices=2",
                  "cluster.split=[1,1]", "pipeline.mode=async", "cluster.reserve_devices=1",
                  "scale.schedule=[{after_step: 0, add: 1}]")
    record.assert_learned(warm_start)
    expected = {(k, i, j) for k in range(steps) for i in range(PROMPTS) for j in range(GROUP)}
    assert set(record.samples) == expected
    assert {sid: v for sid, (_, _, v) in record.samples.items()} == {sid: max(0, sid[0] - 1) for sid in expected}
    (join,) = [e for e in record.events if e["kind"] == "join"]
    assert (join["devices"], join["first_step"]) == ([2], 3), join
    samples = [e for e in record.events if e["kind"] == "sample"]
    assert {e["instance"] for e in samples if e["step"] == 3} == {0, 2}, "the joined device generated nothing"


def test_multi_turn_episodes_with_vllm_train(ray_session, tmp_path, read_run):
    """The built-in multi-turn task (env.name: guess) on vLLM, sync 1+1, 3 steps, from a warm start
    that plays it: episodes of several turns (observations masked), every episode once per step
    under its step's weights version, and every step trains on a non-zero gradient."""
    from poise.training.sft import run_sft
    from types import SimpleNamespace

    guess = "[{mix: {guess: 1.0}}]"
    warm = ["model.tiny.hidden_size=64", "model.tiny.intermediate_size=128", "model.tiny.max_positions=96",
            "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1", "model.sft.steps=100", "model.sft.batch_size=16",
            "model.sft.lr=1e-2", f"data.phases={guess}"]
    cfg = load_train_config(None, warm)
    path = tmp_path / "tiny-guess-sft"
    run_sft(cfg.model, cfg.data, path, threads=1, progress=False)
    start = SimpleNamespace(path=path, overrides=(f"model.path={path}", *warm))
    steps = 3
    record = _run(tmp_path / "run", start, read_run, f"run.steps={steps}", "cluster.devices=2", "cluster.split=[1,1]",
                  "env.name=guess", "env.max_turns=3", "algorithm.sampling.max_new_tokens=4")
    record.assert_learned(start)
    _assert_every_sample_once(record, steps)
    episodes = [e for e in record.events if e["kind"] == "sample"]
    assert max(e["turns"] for e in episodes) == 3 and min(e["turns"] for e in episodes) >= 1
    for e in episodes:  # one model turn per run of 1s, an observation between two
        runs = "".join(map(str, e["loss_mask"])).split("0")
        assert len([r for r in runs if r]) == e["turns"], e
    assert all(r["episode/turns_mean"] > 1.5 for r in record.rows), [r["episode/turns_mean"] for r in record.rows]
