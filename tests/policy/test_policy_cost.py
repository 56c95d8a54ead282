from __future__ import annotations

import pytest

from poise.errors import ConfigError, PoiseError
from poise.policy.cost import CostConfig, CostModel, ContinuousBatch, instance_finish_times, predict_rollout_s


def linear(**kw):
    base = dict(decode_base_s=0.01, decode_per_seq_s=0.001, decode_per_kv_token_s=0.0,
                prefill_per_token_s=0.0, train_per_token_s=0.002, train_fixed_s=1.0,
                train_allreduce_s=0.5, weight_bytes=10.0, sync_bandwidth=5.0, sync_latency_s=0.1)
    base.update(kw)
    return CostModel(CostConfig(**base))


def test_decode_and_train_by_hand():
    c = linear(decode_per_kv_token_s=1e-6)
    assert c.decode_step_s(4, 100) == pytest.approx(0.01 + 0.004 + 4e-6 * 100)
    # segment of 3 steps, batch 2, contexts summing to 20 at the first step: 21 mean, +1, +2
    expect = sum(0.01 + 0.002 + 1e-6 * (20 + 2 * i) for i in range(3))
    assert c.decode_segment_s(2, 20, 3) == pytest.approx(expect)
    # the closed form is the sum of its steps, whatever the batch and length
    assert c.decode_segment_s(5, 321, 40) == pytest.approx(sum(c.decode_step_s(5, 321 / 5 + i) for i in range(40)))
    assert c.train_s(1000, 1) == pytest.approx(2.0 + 1.0)
    assert c.train_s(1000, 4) == pytest.approx(0.5 + 1.0 + 0.5)
    assert c.sync_s() == pytest.approx(0.1 + 2.0)
    assert c.sync_s(nbytes=20.0) == pytest.approx(0.1 + 4.0)


def test_resize_phases_match_dynaresize_fig6():
    c = CostModel()
    assert c.resize("live").critical_path_s == pytest.approx(187.2)
    assert c.resize("hard").critical_path_s == pytest.approx(254.8)
    assert c.resize("live").background_s > 0 and c.resize("hard").background_s == 0
    with pytest.raises(ConfigError):
        c.resize("warm")


def test_continuous_batching_by_hand():
    c = linear()  # step time 0.01 + 0.001 * batch, no prefill, no KV term
    # cap 2, lengths 3, 1, 2: steps 1 with batch 2 (the 1 finishes at 0.012), then the third
    # joins: batch 2 for 1 step (0.024), the first finishes at 3 tokens after 2 more... by hand:
    # t=0 admit A(3), B(1). step1 b=2: 0.012 -> B done. admit C(2) at step 1.
    # steps 2,3 b=2: +0.024 -> t=0.036: A done (3 tokens), C done (2 tokens).
    assert instance_finish_times(c, [3, 1, 2], [0, 0, 0], 2) == pytest.approx([0.036, 0.012, 0.036])
    # cap 1 is sequential
    assert instance_finish_times(c, [2, 1], [0, 0], 1) == pytest.approx([0.022, 0.033])


def test_more_instances_never_slower():
    c = CostModel()
    lengths = [100 * (i % 17 + 1) for i in range(200)]
    times = [predict_rollout_s(c, lengths, 200, n, 32) for n in (1, 2, 4, 8)]
    assert times == sorted(times, reverse=True) and times[0] > 2 * times[-1]


def test_profile_tables_interpolate():
    profile = {"format": "poise-profile/1",
               "decode": [{"batch": 1, "context": 64, "seconds_per_step": 0.01},
                          {"batch": 9, "context": 64, "seconds_per_step": 0.03},
                          {"batch": 1, "context": 128, "seconds_per_step": 0.02},
                          {"batch": 9, "context": 128, "seconds_per_step": 0.04}],
               "prefill": [{"tokens": 10, "seconds": 0.1}, {"tokens": 20, "seconds": 0.3}],
               "train": [{"tokens": 100, "seconds": 1.0}, {"tokens": 200, "seconds": 1.5}],
               "weight_sync": [{"bytes": 1e6, "seconds": 0.01}, {"bytes": 3e6, "seconds": 0.02}]}
    c = CostModel.from_profile(profile)
    assert c.decode_step_s(5, 64) == pytest.approx(0.02)
    assert c.decode_step_s(5, 96) == pytest.approx(0.025)
    assert c.prefill_s(15) == pytest.approx(0.2)
    assert c.train_compute_s(300, 2) == pytest.approx(1.25)
    assert c.sync_s(2e6) == pytest.approx(0.015)
    with pytest.raises(PoiseError, match="poise-profile/1"):
        CostModel.from_profile({"format": "other"})
    with pytest.raises(PoiseError, match="missing or has a bad field"):
        CostModel.from_profile({"format": "poise-profile/1", "decode": []})


def test_bad_cost_values_are_config_errors():
    with pytest.raises(ConfigError, match="cost.train_per_token_s"):
        CostConfig(train_per_token_s=-1.0)
    with pytest.raises(ConfigError, match="sync_bandwidth"):
        CostConfig(sync_bandwidth=0.0)


def test_continuous_batch_steps_one_finish_at_a_time_by_hand():
    c = linear(decode_per_kv_token_s=1e-3, prefill_per_token_s=1e-3)
    batch = ContinuousBatch(c, 2)
    assert batch.admit("a", 10, 3) == pytest.approx(0.01)  # prefill: 10 tokens
    assert batch.admit("b", 0, 1) == 0.0
    assert batch.free == 0
    with pytest.raises(RuntimeError, match="slots"):
        batch.admit("c", 0, 1)
    # one step at batch 2, contexts 10 + 0: 0.01 + 0.002 + 1e-3 * 10; b finishes
    assert batch.advance() == (pytest.approx(0.022), ["b"])
    # c arrives late (the emulated engine admits as requests come): contexts a 11, c 5
    batch.admit("c", 5, 2)
    # two steps at batch 2: contexts 16 then 18; a and c finish together, in admission order
    assert batch.advance() == (pytest.approx(2 * 0.012 + 1e-3 * (16 + 18)), ["a", "c"])
    assert batch.advance() == (0.0, []) and batch.live == 0


def test_profile_train_table_holds_the_optimizer_step_and_resizes_are_measured():
    """A `poise profile` train table times whole updates (the optimizer step is its intercept), so
    no GPU-priced fixed part is added; measured resize phases replace the paper's."""
    base = {"format": "poise-profile/1", "decode": [{"batch": 1, "context": 64, "seconds_per_step": 0.01}],
            "prefill": [{"tokens": 10, "seconds": 0.1}]}
    without = CostModel.from_profile(base)
    assert without.train_fixed_s(1) == CostConfig().train_fixed_s  # no train table: the config's
    assert without.resize("live").critical_path_s == pytest.approx(187.2)
    measured = {**base, "train": [{"tokens": 100, "seconds": 1.0}, {"tokens": 200, "seconds": 1.5}],
                "train_allreduce_s": 0.02,
                "resize": {"live": {"phases": {"abort": 0.01, "group_switch": 0.002},
                                    "background": {"optimizer_staging": 0.03}, "n": 3},
                           "hard": {"phases": {"start": 14.0, "reload": 0.5}, "n": 2}}}
    c = CostModel.from_profile(measured)
    assert c.train_fixed_s(1) == 0.0 and c.train_fixed_s(2) == pytest.approx(0.02)
    assert c.train_s(200, 1) == pytest.approx(1.5)
    assert c.resize("live").critical_path_s == pytest.approx(0.012)
    assert c.resize("live").background_s == pytest.approx(0.03)
    assert c.resize("hard").critical_path_s == pytest.approx(14.5)
    with pytest.raises(PoiseError, match="missing or has a bad field"):
        CostModel.from_profile({**base, "resize": {"live": {"abort": 0.01}}})
