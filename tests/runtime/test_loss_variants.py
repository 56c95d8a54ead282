"""The GRPO family's knobs keep the bitwise promise: colocated = sync 1+3 = 3+1 (one train device
holding every micro-batch, and three splitting them; every split is compared for default GRPO in
test_runtime.py).

Each variant sets knobs off their defaults on every path that could diverge across splits: the
trainer group's advantages (reinforce_pp and grpo_batch wait for the whole step; rloo per group), its loss
normaliser (constant, sequence), the loss on each train device (clip-higher, sequence ratio, a
KL estimator other than k3 with its reference model, the entropy bonus) and the rewards (overlong
shaping), the old log-probs (recomputed by the trainer, over two updates a step) with truncated
importance sampling whose cap bites. Runs start from the session's SFT warm start, so weights move every step (asserted),
and are compared by every sample's tokens and logprobs, the bytes of model and optimizer after
every step, and the rollout/trainer mismatch and correction metrics (histograms summed over
micro-batches).
"""

import math

import pytest

from poise.config import load_train_config
from poise.runtime.driver import train_disaggregated
from poise.training.colocated import train_colocated

from run_shapes import tiny_job

pytestmark = pytest.mark.ray

STEPS = 2
VARIANTS = {
    "dapo-k2-entropy-reinforce_pp-constant": ["algorithm.loss=dapo", "algorithm.kl_coef=0.05",
                                              "algorithm.kl_estimator=k2", "algorithm.entropy_coef=0.01",
                                              "algorithm.advantage=reinforce_pp", "algorithm.loss_agg=constant"],
    "gspo-rloo-overlong": ["algorithm.loss=gspo", "algorithm.advantage=rloo", "algorithm.overlong_buffer=4"],
    # TRL's scale_rewards batch (the step's std: waits for the whole step), its 1e-4, its grpo aggregation
    "trl-batch-std-sequence": ["algorithm.scale_rewards=batch", "algorithm.std_eps=1e-4",
                               "algorithm.loss_agg=sequence"],
    # cap 1: every weight above 1 is cut (Poise's engine and trainer differ by ~1e-7 in fp32); two
    # updates a step: the second mini-batch's old log-probs come from each device's step-start copy
    "recompute-tis-token": ["algorithm.old_logprobs=recompute", "algorithm.rollout_is=token",
                            "algorithm.rollout_is_cap=1.0", "algorithm.updates_per_step=2"],
}


def _mismatch(run) -> list[dict]:
    return [{k: v for k, v in r.items() if k.startswith(("mismatch/", "correction/"))} for r in run.rows]


def _run(train, run_dir, warm_start, read_run, *extra):
    train(load_train_config(None, [*tiny_job(STEPS), f"run.dir={run_dir}", *warm_start.overrides, *extra]))
    return read_run(run_dir)


@pytest.fixture(scope="module")
def default(tmp_path_factory, warm_start, read_run):
    """Default GRPO, colocated: what every variant's first update must differ from."""
    return _run(train_colocated, tmp_path_factory.mktemp("default"), warm_start, read_run, "pipeline.mode=colocated")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_loss_variant_bitwise_equal_across_splits(ray_session, tmp_path, warm_start, read_run, default, variant):
    knobs = VARIANTS[variant]
    ref = _run(train_colocated, tmp_path / "colocated", warm_start, read_run, "pipeline.mode=colocated", *knobs)
    ref.assert_learned(warm_start)
    if "algorithm.overlong_buffer=4" in knobs:  # responses past 12 - 4 tokens lost reward
        assert any(r["reward/overlong"] < 0 for r in ref.rows), [r["reward/overlong"] for r in ref.rows]
    # the knobs change the training: the first update differs from default GRPO's
    first = ref.checkpoint_steps()[0]
    assert ref.digest(first, "model.safetensors") != default.digest(first, "model.safetensors"), variant
    # the mismatch of Poise's own engine in fp32 against the trainer: small, but measured
    for row in _mismatch(ref):
        assert 0 <= row["mismatch/logp_abs_diff_mean"] <= row["mismatch/logp_abs_diff_max"] < 1e-3, row
        assert all(math.isfinite(v) for v in row.values()), row
        assert row["mismatch/ratio_p05"] <= row["mismatch/ratio_p50"] <= row["mismatch/ratio_p95"], row
    if "algorithm.rollout_is=token" in knobs:  # the correction ran, and its cap cut some weights
        assert any(row["mismatch/is_truncated_frac"] > 0 for row in _mismatch(ref)), _mismatch(ref)
        for row in _mismatch(ref):  # the step's correction metrics, compared across splits below
            assert row["correction/truncated_frac"] == row["mismatch/is_truncated_frac"], row
            assert row["correction/masked_frac"] == 0.0 and row["correction/is_weight_max"] <= 1.0, row
            assert row["correction/is_weight_p05"] <= row["correction/is_weight_p50"] <= 1.0, row
    for split in [(1, 3), (3, 1)]:
        got = _run(train_disaggregated, tmp_path / f"sync-{split[0]}-{split[1]}", warm_start, read_run,
                   "run.verify_sync=true", "pipeline.mode=sync", f"cluster.split=[{split[0]},{split[1]}]", *knobs)
        got.assert_learned(warm_start)
        got.assert_bitwise_equal(ref, f"{variant}: sync {split} vs colocated")
        assert _mismatch(got) == _mismatch(ref), f"{variant}: sync {split} vs colocated"  # the same bits
