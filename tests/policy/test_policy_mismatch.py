"""The rollout/trainer mismatch statistics add up over micro-batches: a fixed-grid histogram of the
log-ratio gives the quantiles (the same numbers however the micro-batches are split: checked on
real runs in tests/runtime/test_loss_variants.py)."""

import math

import pytest

from poise.policy.mismatch import (LOG_RATIO_BINS, MAGNITUDE_EDGES, ZERO_BIN, MismatchStats, bin_value,
                                   histogram_quantile, mismatch_metrics)
from poise.policy.plan import mini_of_prompt, plan_step


def test_the_grid_by_hand():
    assert LOG_RATIO_BINS == 201 and ZERO_BIN == 100
    assert MAGNITUDE_EDGES[0] == pytest.approx(1e-9) and MAGNITUDE_EDGES[-1] == pytest.approx(10.0)
    assert bin_value(ZERO_BIN) == 0.0
    # the first positive bin holds |d| in [1e-9, 10**-8.9): its centre is 10**-8.95
    assert bin_value(ZERO_BIN + 1) == pytest.approx(10 ** -8.95)
    assert bin_value(ZERO_BIN - 1) == pytest.approx(-(10 ** -8.95))
    assert bin_value(LOG_RATIO_BINS - 1) == pytest.approx(10 ** 0.95)  # the top bin: [10**0.9, inf)
    assert bin_value(0) == pytest.approx(-(10 ** 0.95))
    with pytest.raises(ValueError, match="outside"):
        bin_value(LOG_RATIO_BINS)


def test_quantiles_of_a_histogram_by_hand():
    hist = [0] * LOG_RATIO_BINS
    hist[ZERO_BIN - 91] = 1  # one value in -[1, 10**0.1) (magnitude bin 90), reported as -10**0.05
    hist[ZERO_BIN] = 18  # 18 exact agreements
    hist[ZERO_BIN + 61] = 1  # one value of about +10**-2.95 (bin [1e-3, 10**-2.9))
    # 20 values: p05 is the 1st smallest, p50 the 10th, p95 the 19th
    assert histogram_quantile(hist, 0.05) == pytest.approx(-(10 ** 0.05))
    assert histogram_quantile(hist, 0.5) == 0.0
    assert histogram_quantile(hist, 0.95) == 0.0
    assert histogram_quantile(hist, 1.0) == pytest.approx(10 ** -2.95)
    assert histogram_quantile([0] * LOG_RATIO_BINS, 0.5) == 0.0


def test_metrics_by_hand():
    hist_a, hist_b = [0] * LOG_RATIO_BINS, [0] * LOG_RATIO_BINS
    hist_a[ZERO_BIN + 81] = 2  # two tokens with d in [0.1, 10**-0.9)
    hist_b[ZERO_BIN - 81] = 2  # two with -d there
    parts = [MismatchStats(tokens=2, abs_sum=0.25, abs_max=0.15, hist=tuple(hist_a), is_tokens=2, is_weight_sum=2.5,
                           is_truncated=1),
             MismatchStats(tokens=2, abs_sum=0.23, abs_max=0.12, hist=tuple(hist_b), is_tokens=2, is_weight_sum=1.5,
                           is_truncated=0),
             MismatchStats(is_tokens=4, is_weight_sum=4.0)]  # a later mini-batch: weighted, not measured
    got = mismatch_metrics(parts)
    assert got == pytest.approx({
        "mismatch/logp_abs_diff_mean": 0.48 / 4, "mismatch/logp_abs_diff_max": 0.15,
        "mismatch/ratio_p05": math.exp(-(10 ** -0.95)), "mismatch/ratio_p50": math.exp(-(10 ** -0.95)),
        "mismatch/ratio_p95": math.exp(10 ** -0.95),
        "mismatch/is_weight_mean": 8.0 / 8, "mismatch/is_truncated_frac": 1 / 8})
    plain = [MismatchStats(p.tokens, p.abs_sum, p.abs_max, p.hist) for p in parts[:2]]  # rollout_is none
    assert mismatch_metrics(plain) == {k: v for k, v in got.items() if not k.startswith("mismatch/is_")}
    assert mismatch_metrics([MismatchStats(), MismatchStats()]) == {}  # nothing measured (emulated compute)
    assert mismatch_metrics(parts[2:]) == {"mismatch/is_weight_mean": 1.0, "mismatch/is_truncated_frac": 0.0}


def test_a_micro_batch_knows_its_mini_batch_from_its_sample_ids():
    plan = plan_step(3, 8, 4, updates_per_step=4, micro_batch_size=3)
    for mini in plan.minis:
        for ids in mini.micro:
            assert {mini_of_prompt(sid[1], 8, 4) for sid in ids} == {mini.index}
            assert {plan.mini_of(sid) for sid in ids} == {mini.index}
