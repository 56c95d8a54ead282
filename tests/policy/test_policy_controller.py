from __future__ import annotations

import pytest

from poise.errors import ConfigError
from poise.policy.controller import NO_HYSTERESIS, ControllerConfig, ResizeController, StepObservation
from poise.policy.cost import CostConfig, CostModel
from poise.policy.split import Split

COST = CostModel(CostConfig(decode_base_s=0.01, decode_per_seq_s=0.0, decode_per_kv_token_s=0.0,
                            prefill_per_token_s=0.0, train_per_token_s=0.01 / 8, train_fixed_s=0.0,
                            train_allreduce_s=0.0, weight_bytes=0.0, sync_latency_s=0.0,
                            resize_live={"all": 50.0}))
ALLOWED = [Split(6, 2), Split(4, 4), Split(2, 6)]
LENGTHS = tuple([100] * 640)  # balanced at 4:4 for COST (see test_policy_allocator)


def obs(step, split, rollout_s, train_s, now=None):
    step_s = max(rollout_s, train_s)
    return StepObservation(step, now if now is not None else 10.0 * (step + 1), split, rollout_s,
                           train_s, step_s, LENGTHS, 0)


def imbalanced(split=Split(6, 2)):
    # At 6:2 this workload trains 3x slower than it generates: predicted 4:4 is much better.
    return 5.4, 16.0


def test_consecutive_signals_then_resize_with_reason():
    ctl = ResizeController(ControllerConfig(consecutive=3, cooldown_steps=0, break_even=False, window=1),
                           COST, "async", "live", ALLOWED, batch_cap=8)
    d = [ctl.observe(obs(k, Split(6, 2), *imbalanced())) for k in range(3)]
    assert [x.action for x in d] == ["hold", "hold", "resize"]
    assert "signal 1/3" in d[0].reason and "signal 2/3" in d[1].reason
    assert d[2].target == Split(4, 4) and "6:2 -> 4:4" in d[2].reason
    assert d[2].estimate.predicted_gain_s == pytest.approx(16.0 - 8.0, rel=0.1)
    assert d[2].estimate.break_even_steps == pytest.approx(50.0 / d[2].estimate.predicted_gain_s)


def test_cooldown_holds_after_a_resize():
    ctl = ResizeController(ControllerConfig(consecutive=1, cooldown_steps=5, break_even=False, window=1),
                           COST, "async", "live", ALLOWED, batch_cap=8)
    assert ctl.observe(obs(0, Split(6, 2), *imbalanced())).action == "resize"
    later = ctl.observe(obs(1, Split(6, 2), *imbalanced()))
    assert later.action == "hold" and later.reason.startswith("cooldown: 1 of 5")
    assert ctl.observe(obs(6, Split(6, 2), *imbalanced())).action == "resize"


def test_balanced_steps_never_signal():
    ctl = ResizeController(NO_HYSTERESIS, COST, "async", "live", ALLOWED, batch_cap=8)
    d = ctl.observe(obs(0, Split(4, 4), 8.0, 8.0))
    assert d.action == "hold" and d.reason.startswith("balanced") and not d.signal


def test_break_even_uses_observed_regime_length():
    cfg = ControllerConfig(consecutive=1, cooldown_steps=0, break_even=True, window=1,
                           persistence_prior_steps=20)
    ctl = ResizeController(cfg, COST, "async", "live", ALLOWED, batch_cap=8)
    # Two balanced steps end up as a regime of 2 steps when the workload turns train-heavy;
    # the expected persistence is then 2 - 1 steps, and 1 x 4 s of gain never pays 50 s.
    ctl.observe(obs(0, Split(4, 4), 8.0, 8.0))
    ctl.observe(obs(1, Split(4, 4), 8.0, 8.0))
    d = ctl.observe(obs(2, Split(4, 4), 4.0, 12.0))
    assert d.signal and d.action == "hold" and d.reason.startswith("break-even"), d.reason
    assert ctl.ended_regimes == [2]
    assert d.estimate.predicted_gain_s == pytest.approx(4.0, rel=0.1)
    # With no regime ended yet the prior (20 steps) makes the same resize pay.
    fresh = ResizeController(cfg, COST, "async", "live", ALLOWED, batch_cap=8)
    d = fresh.observe(obs(0, Split(4, 4), 4.0, 12.0))
    assert d.action == "resize" and d.target == Split(2, 6)


def test_dwell_time_holds():
    cfg = ControllerConfig(consecutive=1, dwell_s=25.0, cooldown_steps=0, break_even=False, window=1)
    ctl = ResizeController(cfg, COST, "async", "live", ALLOWED, batch_cap=8)
    first = ctl.observe(obs(0, Split(6, 2), 5.4, 16.0, now=16.0))
    assert first.action == "hold" and first.reason.startswith("dwell")
    assert ctl.observe(obs(1, Split(6, 2), 5.4, 16.0, now=32.0)).action == "resize"


@pytest.mark.parametrize("field,value,needle", [("cooldown_steps", -1, "cooldown_steps"),
                                                ("consecutive", 0, "consecutive"),
                                                ("threshold", -0.1, "threshold"),
                                                ("dwell_s", -5.0, "dwell_s")])
def test_bad_controller_values(field, value, needle):
    with pytest.raises(ConfigError, match=needle):
        ControllerConfig(**{field: value})


def test_measured_sync_replaces_the_models():
    """The model's weight sync (the default 16 GB at 25 GB/s) dwarfs a CPU step; where the driver
    measured the sync, the predictions carry the measured one."""
    cost = CostModel(CostConfig(decode_base_s=0.01, decode_per_seq_s=0.0, decode_per_kv_token_s=0.0,
                                prefill_per_token_s=0.0, train_per_token_s=0.01 / 8, train_fixed_s=0.0,
                                train_allreduce_s=0.0))
    ctl = ResizeController(ControllerConfig(window=1), cost, "sync", "live", ALLOWED, batch_cap=8)
    base = StepObservation(0, 10.0, Split(4, 4), 8.0, 8.0, 16.7, LENGTHS, 0)
    model_sync = cost.sync_s()
    assert model_sync > 0.5
    unmeasured = ctl.predictions(base)
    measured = ctl.predictions(StepObservation(0, 10.0, Split(4, 4), 8.0, 8.0, 16.01, LENGTHS, 0, sync_s=0.01))
    for split in ALLOWED:
        assert unmeasured[split] - measured[split] == pytest.approx(model_sync - 0.01)


def test_break_even_prices_the_next_resize_at_the_measured_one():
    """The model prices a live resize at 50 s here; once a resize measured 0.5 s, the same signal
    pays (and the reason quotes the measured price)."""
    cfg = ControllerConfig(consecutive=1, cooldown_steps=0, break_even=True, window=1,
                           persistence_prior_steps=5)
    ctl = ResizeController(cfg, COST, "async", "live", ALLOWED, batch_cap=8)
    held = ctl.observe(obs(0, Split(4, 4), 4.0, 12.0))  # 4 s/step x 5 steps < 50 s
    assert held.action == "hold" and held.reason.startswith("break-even") and held.estimate.predicted_cost_s == 50.0
    ctl.resized(0.5)
    d = ctl.observe(obs(1, Split(4, 4), 4.0, 12.0))
    assert d.action == "resize" and d.estimate.predicted_cost_s == 0.5 and "resize 0.5s pays back" in d.reason
    assert set(d.event_fields()["predicted_step_s"]) == {"2:6", "4:4", "6:2"}
