from __future__ import annotations

import pytest

from poise.errors import ConfigError
from poise.policy.allocator import StepWorkload, allocate, compose_step, predict_step
from poise.policy.cost import CostConfig, CostModel
from poise.policy.split import Split, all_splits


def test_compose_step_by_hand():
    assert compose_step("sync", 10, 6, 1) == 17
    assert compose_step("stream", 10, 6, 1, stream_train_tail_s=2) == 13
    assert compose_step("stream", 3, 6, 1, stream_train_tail_s=2) == 7  # train-bound
    assert compose_step("async", 10, 6, 1) == 10
    assert compose_step("async", 6, 6, 4) == 8  # sync on the critical cycle
    with pytest.raises(ConfigError):
        compose_step("batch", 1, 1, 1)


def test_split_validation_and_enumeration():
    with pytest.raises(ConfigError, match="train has 0 devices"):
        Split(8, 0)
    with pytest.raises(ConfigError, match="rollout has 0 devices"):
        Split.parse([0, 8])
    assert Split.parse("6:2") == Split(6, 2)
    assert [str(s) for s in all_splits(8, 2)] == ["2:6", "4:4", "6:2"]


def test_allocator_balances_a_throughput_bound_workload():
    # Many equal short samples: rollout time ~ 1/R, train ~ 1/T. Make train per token cost the
    # same device-seconds as decoding so the balanced split is the middle one.
    cost = CostModel(CostConfig(decode_base_s=0.01, decode_per_seq_s=0.0, decode_per_kv_token_s=0.0,
                                prefill_per_token_s=0.0, train_per_token_s=0.01 / 8,
                                train_fixed_s=0.0, train_allreduce_s=0.0, weight_bytes=0.0))
    work = StepWorkload(tuple([100] * 640), prompt_len=0)
    a = allocate(cost, work, devices=8, mode="async", batch_caps=(8,))
    assert a.split == Split(4, 4)
    assert a.predicted.rollout_s == pytest.approx(a.predicted.train_s, rel=0.05)
    # With training 3x as expensive the allocator moves devices to train.
    cost3 = CostModel(CostConfig(decode_base_s=0.01, decode_per_seq_s=0.0, decode_per_kv_token_s=0.0,
                                 prefill_per_token_s=0.0, train_per_token_s=0.03 / 8,
                                 train_fixed_s=0.0, train_allreduce_s=0.0, weight_bytes=0.0))
    assert allocate(cost3, work, 8, "async", batch_caps=(8,)).split == Split(2, 6)
    assert len(a.table) == 7


def test_predict_step_rejects_partial_instances():
    with pytest.raises(ConfigError, match="multiple of devices_per_instance"):
        predict_step(CostModel(), StepWorkload((10,), 0), Split(3, 5), "sync", devices_per_instance=2)


def test_pipeline_rules():
    from poise.policy.pipeline import PipelineConfig, pipeline_kind, weights_version

    assert [weights_version(k, "sync") for k in range(3)] == [0, 1, 2]
    assert [weights_version(k, "async") for k in range(3)] == [0, 0, 1]
    with pytest.raises(ConfigError):
        weights_version(1, "lazy")
    assert [pipeline_kind(m, s) for m in ("colocated", "sync", "async") for s in (False, True)] == \
        ["sync", "sync", "sync", "stream", "async", "async"]
    assert all(PipelineConfig.of_kind(k).kind == k for k in ("sync", "stream", "async"))
    with pytest.raises(ConfigError, match="pipeline.mode"):
        pipeline_kind("batch", True)
