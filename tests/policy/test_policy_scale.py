"""The scale-out policy (policy/scale.py): hysteresis, cooldown, the reserve cap, the schedule."""

import pytest

from poise.errors import ConfigError
from poise.policy.scale import (ScaleConfig, ScaleController, ScaleObservation, ScheduledJoins, StaticPool,
                                first_step_served, make_scale_policy)


def _obs(step: int, lag: float, instances: int = 4, train_s: float = 10.0) -> ScaleObservation:
    return ScaleObservation(step, train_s * (1.0 + lag), train_s, instances)


def _drive(ctl, lags, instances: int = 4) -> list:
    out = []
    for k, lag in enumerate(lags):
        d = ctl.observe(_obs(k, lag, instances), now=10.0 * k)
        out.append(d)
        instances = d.target
    return out


def test_adds_after_consecutive_lagging_steps_only():
    ctl = ScaleController(ScaleConfig(policy="controller", threshold=0.1, consecutive=3, cooldown_steps=0), limit=4)
    ds = _drive(ctl, [0.5, 0.5, 0.0, 0.5, 0.5, 0.5])  # a balanced step resets the count
    assert [d.action for d in ds] == ["hold"] * 5 + ["add"]
    assert [d.signal for d in ds] == [True, True, False, True, True, True]
    add = ds[-1]
    assert (add.current, add.target) == (4, 5)
    assert "lags training by 50%" in add.reason and "4 -> 5" in add.reason
    assert add.now == 50.0 and add.step == 5
    assert add.event_fields()["what"] == "scale" and add.event_fields()["to"] == 5


def test_threshold_is_strict_and_a_lag_below_it_never_adds():
    ctl = ScaleController(ScaleConfig(policy="controller", threshold=0.1, consecutive=1, cooldown_steps=0), limit=4)
    ds = _drive(ctl, [0.09, 0.05, -0.3, 0.0] * 5)
    assert all(d.action == "hold" and not d.signal for d in ds)
    assert "keeps up" in ds[0].reason
    assert _drive(ctl, [0.11])[0].action == "add"


def test_cooldown_holds_after_a_join_then_adds_again():
    ctl = ScaleController(ScaleConfig(policy="controller", threshold=0.1, consecutive=1, cooldown_steps=3), limit=4)
    ds = _drive(ctl, [0.5] * 9)
    assert [d.action for d in ds] == ["add", "hold", "hold", "hold", "add", "hold", "hold", "hold", "add"]
    assert ds[1].reason.startswith("cooldown: 1 of 3")
    assert [d.target for d in ds if d.action == "add"] == [5, 6, 7]


def test_reserve_caps_the_joins():
    ctl = make_scale_policy(ScaleConfig(policy="controller", consecutive=1, cooldown_steps=0), reserve_instances=2)
    ds = _drive(ctl, [1.0] * 6)
    assert sum(d.action == "add" for d in ds) == 2
    assert "reserve is spent" in ds[-1].reason
    capped = make_scale_policy(ScaleConfig(policy="controller", consecutive=1, cooldown_steps=0, max_instances=1), 4)
    assert sum(d.action == "add" for d in _drive(capped, [1.0] * 6)) == 1


def test_predicted_gain_is_bounded_by_the_train_time():
    ctl = ScaleController(ScaleConfig(policy="controller", consecutive=1), limit=4)
    d = ctl.observe(ScaleObservation(0, 12.0, 10.0, 2), 0.0)  # 3 instances: 8 s, but the step waits on train
    assert d.action == "add" and d.estimate.predicted_gain_s == pytest.approx(2.0)
    d = ScaleController(ScaleConfig(policy="controller", consecutive=1), 4).observe(
        ScaleObservation(0, 40.0, 10.0, 1), 0.0)
    assert d.estimate.predicted_gain_s == pytest.approx(20.0)


def test_schedule_and_static():
    cfg = ScaleConfig(schedule=({"after_step": 1, "add": 2}, {"after_step": 4, "add": 1}))
    assert cfg.scheduled() == {1: 2, 4: 1} and cfg.active and cfg.most_added(8) == 3
    ctl = make_scale_policy(cfg, reserve_instances=3)
    assert isinstance(ctl, ScheduledJoins)
    ds = _drive(ctl, [0.0] * 6, instances=2)
    assert [(d.step, d.target) for d in ds if d.action == "add"] == [(1, 4), (4, 5)]
    static = make_scale_policy(ScaleConfig(), 4)
    assert isinstance(static, StaticPool) and not ScaleConfig().active
    assert all(d.action == "hold" for d in _drive(static, [5.0] * 4))


def test_first_step_served_follows_the_dispatch_ahead():
    assert first_step_served(3, "sync") == 5 and first_step_served(3, "stream") == 5
    assert first_step_served(3, "async") == 6


@pytest.mark.parametrize("kwargs, key", [
    ({"threshold": -0.1}, "scale.threshold"),
    ({"consecutive": 0}, "scale.consecutive"),
    ({"cooldown_steps": -1}, "scale.cooldown_steps"),
    ({"max_instances": -1}, "scale.max_instances"),
    ({"schedule": ({"after_step": 1, "add": 1},), "policy": "controller"}, "scale.schedule"),
    ({"schedule": ({"at_step": 1, "add": 1},)}, "scale.schedule[0]"),
    ({"schedule": ({"after_step": -1, "add": 1},)}, "scale.schedule[0].after_step"),
    ({"schedule": ({"after_step": 1, "add": 0},)}, "scale.schedule[0].add"),
    ({"schedule": ({"after_step": 1, "add": 1}, {"after_step": 1, "add": 2})}, "scale.schedule[1].after_step"),
])
def test_bad_config_names_the_key(kwargs, key):
    with pytest.raises(ConfigError) as e:
        ScaleConfig(**kwargs)
    assert e.value.key == key
    assert "\n" not in str(e.value)
