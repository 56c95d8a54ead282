"""Device types, links and the device planner (policy/devices.py, CostModel.on_devices, plan_devices)."""

from __future__ import annotations

import random

import pytest

from poise.errors import ConfigError
from poise.policy.allocator import StepWorkload, plan_devices
from poise.policy.cost import CostConfig, CostModel, instance_finish_times
from poise.policy.devices import PRESETS, DeviceType, Fleet, Link

CFG = CostConfig(decode_base_s=0.005, decode_per_seq_s=3e-5, decode_per_kv_token_s=2e-8, prefill_per_token_s=3e-5,
                 train_per_token_s=1.5e-4, train_fixed_s=1.5, train_allreduce_s=0.6, weight_bytes=10e9,
                 sync_bandwidth=40e9, sync_latency_s=0.05, sync_bucket_bytes=1e9)
H20, H800 = PRESETS["h20"], PRESETS["h800"]


def fleet(h20_price: float | None = None, **link) -> Fleet:
    groups = ("dc-train", "dc-gen") if link else ("local", "local")
    links = (Link(("dc-train", "dc-gen"), **link),) if link else ()
    return Fleet((DeviceType("h800", 16, group=groups[0]), DeviceType("h20", 32, price_per_hour=h20_price,
                                                                       group=groups[1])), links, "h800")


def test_placing_on_the_reference_type_changes_no_number():
    cost, placed = CostModel(CFG), fleet().place(CostModel(CFG), "h800", "h800")
    rng = random.Random(0)
    lengths = [rng.randint(1, 4000) for _ in range(300)]
    prompts = [rng.randint(10, 600) for _ in range(300)]
    assert instance_finish_times(placed, lengths, prompts, 32) == instance_finish_times(cost, lengths, prompts, 32)
    for batch, ctx in ((1, 0), (64, 100), (64, 9000)):
        assert placed.decode_step_s(batch, ctx) == cost.decode_step_s(batch, ctx)
    assert placed.prefill_s(500) == cost.prefill_s(500)
    assert placed.train_s(1e6, 4) == cost.train_s(1e6, 4)
    assert placed.sync_s() == cost.sync_s()
    # ... while another type changes them (the test above could not pass by ignoring the type)
    other = fleet().place(CostModel(CFG), "h20", "h20")
    assert instance_finish_times(other, lengths, prompts, 32) != instance_finish_times(cost, lengths, prompts, 32)


def test_each_role_is_priced_on_its_type():
    ref = CostModel(CFG)
    c = fleet().place(ref, "h20", "h800")
    bw, flops = H800["mem_bw_tbps"] / H20["mem_bw_tbps"], H800["tflops"] / H20["tflops"]
    # one sequence: memory-bound, the H20's extra bandwidth makes it faster
    assert c.decode_step_s(1, 100) == pytest.approx(ref.decode_step_s(1, 100) * bw, rel=1e-12)
    assert c.decode_step_s(1, 100) < ref.decode_step_s(1, 100)
    # 64 sequences: the matmuls at 148 TFLOPS set the floor (roofline)
    assert c.decode_step_s(64, 100) == pytest.approx(64 * CFG.decode_per_seq_s * flops, rel=1e-12)
    assert c.decode_step_s(64, 100) > ref.decode_step_s(64, 100) * bw
    assert c.prefill_s(1000) == pytest.approx(ref.prefill_s(1000) * flops, rel=1e-12)
    assert c.train_s(1e6, 4) == ref.train_s(1e6, 4)  # training stays on the H800
    swapped = fleet().place(ref, "h800", "h20")
    assert swapped.train_compute_s(1e6, 4) == pytest.approx(ref.train_compute_s(1e6, 4) * flops, rel=1e-12)
    assert swapped.train_fixed_s(4) == pytest.approx(CFG.train_fixed_s * bw + CFG.train_allreduce_s, rel=1e-12)
    assert swapped.decode_step_s(64, 100) == ref.decode_step_s(64, 100)
    # placing a placed model starts from the model as written
    assert fleet().place(c, "h800", "h800").decode_step_s(64, 100) == ref.decode_step_s(64, 100)


def test_decode_segment_closed_form_matches_the_steps_across_the_roofline_knee():
    c = fleet().place(CostModel(CFG), "h20", "h800")
    floor = 64 * CFG.decode_per_seq_s * H800["tflops"] / H20["tflops"]
    # (64, 5000, 3000) starts compute-bound and ends memory-bound: both parts of the closed form
    assert c.decode_step_s(64, 5000) == pytest.approx(floor, rel=1e-12)
    assert c.decode_step_s(64, 7999) > floor * 1.05
    for batch, ctx, steps in ((64, 5000, 3000), (64, 100, 5000), (64, 20000, 10), (16, 100, 3000), (40, 50, 700)):
        direct = sum(c.decode_step_s(batch, ctx + s) for s in range(steps))
        assert c.decode_segment_s(batch, ctx * batch, steps) == pytest.approx(direct, rel=1e-9)


def test_weight_sync_across_a_link_is_bucketed_and_pipelined():
    ref = CostModel(CFG)
    c = fleet(gbps=80, latency_ms=5).place(ref, "h20", "h800")
    # 10 buckets of 1 GB; each crosses in 5 ms + 0.1 s and fans out in 25 ms behind the next one
    assert c.sync_s() == pytest.approx(0.05 + 10 * 0.105 + 0.025, rel=1e-12)
    small = fleet(gbps=80, latency_ms=5).place(CostModel(CostConfig(**{**CFG.__dict__, "sync_bucket_bytes": 1e8})),
                                                "h20", "h800")
    assert small.sync_s() == pytest.approx(0.05 + 100 * 0.015 + 0.0025, rel=1e-12)  # latency paid 100 times
    times = [fleet(gbps=g, latency_ms=5).place(ref, "h20", "h800").sync_s() for g in (10, 40, 80, 400)]
    assert times == sorted(times, reverse=True)
    # a fast link leaves the local broadcast as the slower stage
    assert times[-1] == pytest.approx(0.05 + 10 * 0.025 + 0.005 + 1e9 / 50e9, rel=1e-12)
    assert fleet().place(ref, "h20", "h800").sync_s() == ref.sync_s()  # same group: no link


def works(n_steps: int = 2, samples: int = 256) -> list[StepWorkload]:
    rng = random.Random(1)
    return [StepWorkload(tuple(min(16384, int(rng.lognormvariate(7.0, 0.8))) for _ in range(samples)), 300)
            for _ in range(n_steps)]


def test_planner_puts_each_role_on_the_type_cheaper_for_it_and_prices_drive_it():
    plans = {price: plan_devices(CostModel(CFG), fleet(h20_price=price), works(), "async", 24.0,
                                 batch_caps=(16, 32, 64), micro_batches=8) for price in (1.0, 2.0, 3.0)}
    plan = plans[1.0]
    best = plan.best
    assert (best.rollout_type, best.train_type) == ("h20", "h800")
    assert set(plan.single_type) == {"h20", "h800"}
    assert all(d.rollout_type == d.train_type == name for name, d in plan.single_type.items())
    assert best.tokens_per_dollar > 1.1 * max(d.tokens_per_dollar for d in plan.single_type.values())
    assert all(d.price_per_hour <= 24.0 and d.split.train <= 8 for d in plan.table)
    # dearer H20s: fewer are bought and the advantage over the H800-only split shrinks
    bought = [plans[p].best.split.rollout if plans[p].best.rollout_type == "h20" else 0 for p in (1.0, 2.0, 3.0)]
    assert bought == sorted(bought, reverse=True) and bought[0] > bought[-1]
    edge = [plans[p].best.tokens_per_dollar / plans[p].single_type["h800"].tokens_per_dollar for p in (1.0, 2.0, 3.0)]
    assert edge == sorted(edge, reverse=True) and edge[-1] < 1.0 < edge[0]


def test_planner_respects_memory_and_a_budget_that_buys_nothing_is_an_error():
    big = CostConfig(**{**CFG.__dict__, "weight_bytes": 85e9})  # fits an H20 (96 GB), not an H800 (80 GB)
    plan = plan_devices(CostModel(big), fleet(), works(1, 64), "async", 40.0, micro_batches=16)
    assert all(d.rollout_type == "h20" for d in plan.table)
    assert all(d.split.train * 80 >= 8 * 85 for d in plan.table if d.train_type == "h800")
    with pytest.raises(ConfigError, match="budget_per_hour"):
        plan_devices(CostModel(CFG), fleet(), works(1, 64), "async", 1.5)


def test_bad_device_types_and_links_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"'h900'.*unknown device type: use a preset \(h20, h800"):
        DeviceType("h900", 4)
    DeviceType("mine", 4, tflops=100, mem_bw_tbps=2, memory_gb=48, price_per_hour=0.7)  # a full spec is fine
    for price in (0, -1.0):
        with pytest.raises(ConfigError, match="price_per_hour.*must be > 0"):
            DeviceType("h20", 4, price_per_hour=price)
    with pytest.raises(ConfigError, match="unknown device group 'dc-x'; the groups are dc-gen, dc-train"):
        Fleet((DeviceType("h800", 1, group="dc-train"), DeviceType("h20", 1, group="dc-gen")),
              (Link(("dc-train", "dc-x")),))
    with pytest.raises(ConfigError, match="'dc-gen' and 'dc-train' have no link"):
        Fleet((DeviceType("h800", 1, group="dc-train"), DeviceType("h20", 1, group="dc-gen")))
    with pytest.raises(ConfigError, match="listed twice"):
        Fleet((DeviceType("h20", 1), DeviceType("h20", 2)))
    with pytest.raises(ConfigError, match="two different device groups"):
        Link(("dc-a", "dc-a"))
    with pytest.raises(ConfigError, match="cost.device"):
        Fleet((DeviceType("h20", 1),), (), "h900")
