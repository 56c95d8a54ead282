"""Elastic scale-out of generation (StreamRL §4.2): decides, once per step, whether a reserve
device joins the job as one more data-parallel rollout instance.

Interface (runtime driver, simulator):

    scaler = make_scale_policy(ScaleConfig(policy="controller"), reserve_instances=2)
    decision = scaler.observe(ScaleObservation(step, rollout_s, train_s, instances), now)
    if decision.action == "add": join decision.target - decision.current instances  # assumed applied

The signal. Generation lags training when the step's generation span exceeds the train side's
busy time by more than `threshold`: lag = rollout_s / train_s - 1. In async (one-step
pipelining) the step is the slower stage, so a lagging generation idles the trainer for the
whole lag; in sync with streaming the trainer waits on the last samples. Only generation lag
scales out: the paper's elastic mechanism adds generation units, never train units (trainer
parallelism is rigid; `policy/controller.py` moves devices between the roles instead).

The threshold StreamRL does not give. Ours: 0.10 (generation 10% slower than training) for 3
consecutive steps, then a cooldown of 3 steps. Why these values:
  - 10% is the trainer's idle share the job tolerates before it buys a device: below it one more
    instance of r (which cuts generation by up to 1/(r+1), 20-50% for r = 1..4) would overshoot
    and leave the new device mostly idle.
  - One step's ratio is noisy (a step's long tail moves its generation span): on the
    `streamrl-elastic` scenario's stationary first phase (a balanced pool) the lag is +4% on
    average with a 6.7% step-to-step spread, and 5 of 29 steps exceed 10%
    (benchmarks/sim_elastic.py prints it). One step over the threshold therefore means little;
    3 in a row (~0.5% if steps were independent) does, and there 10% is the lowest threshold that
    adds no device in that phase (5% adds one at step 5), while 20% misses the lag of the last
    phase (+17%..+30% with 6-7 instances).
  - The cooldown covers the pipeline lag: a device joining after step k serves from step k+2
    (sync) or k+3 (async), because the next step's generation is already dispatched
    (`first_step_served`); observations before then still show the old pool, and a controller
    without the cooldown would add again for the same lag.
Departure from the paper: a join is never undone here (StreamRL does not describe scale-in).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from poise.config.policy import ScaleConfig
from poise.policy.decision import Decision
from poise.policy.hysteresis import Hysteresis




def first_step_served(decided_after: int, pipeline_kind: str) -> int:
    """The first step a device joining after step `decided_after` generates for: the runtime has
    already dispatched the next step's generation (sync, stream) or the next two (async)."""
    return decided_after + (3 if pipeline_kind == "async" else 2)


@dataclass(frozen=True)
class ScaleObservation:
    """One step as the scale policy sees it. Seconds: `rollout_s` the span of the generation the
    step waited for, `train_s` the busiest train device's compute of the step."""

    step: int
    rollout_s: float
    train_s: float
    instances: int  # rollout instances serving now (joined ones included)


@dataclass(frozen=True)
class ScaleEstimate:
    """What the scale policy measured and predicted when it decided."""

    what: ClassVar[str] = "scale"
    lag: float = 0.0  # rollout_s / train_s - 1
    predicted_gain_s: float = 0.0  # per step, if generation scales with instances (an upper bound)

    def event_fields(self) -> dict:
        return {"lag": round(self.lag, 4), "predicted_gain_s": self.predicted_gain_s, "predicted_cost_s": None,
                "break_even_steps": None}


ScaleDecision = Decision[int, ScaleEstimate]  # from and to: rollout instances held; action hold or add


class ScalePolicy(Protocol):
    """What a driver calls once per step: `ScaleController`, `ScheduledJoins` or `StaticPool`."""

    def observe(self, obs: ScaleObservation, now: float) -> ScaleDecision: ...


def _lag(obs: ScaleObservation) -> float:
    return obs.rollout_s / obs.train_s - 1.0 if obs.train_s > 0 else 0.0


def _gain(obs: ScaleObservation, add: int) -> float:
    """Step seconds saved if generation shrank as instances/(instances+add), never below train."""
    shorter = obs.rollout_s * obs.instances / (obs.instances + add)
    return max(0.0, obs.rollout_s - max(shorter, obs.train_s))


class StaticPool:
    """Never adds (the fixed pool), with the controller's interface."""

    def observe(self, obs: ScaleObservation, now: float) -> ScaleDecision:
        return Decision(obs.step, now, "hold", obs.instances, obs.instances, "static pool", ScaleEstimate(_lag(obs)))


class ScheduledJoins:
    """A forced schedule (`scale.schedule`): after step N, `add` devices join."""

    def __init__(self, schedule: dict[int, int]):
        self.schedule = dict(schedule)

    def observe(self, obs: ScaleObservation, now: float) -> ScaleDecision:
        add = self.schedule.get(obs.step, 0)
        if not add:
            return Decision(obs.step, now, "hold", obs.instances, obs.instances, "no join scheduled",
                            ScaleEstimate(_lag(obs)))
        return Decision(obs.step, now, "add", obs.instances, obs.instances + add,
                        f"scale.schedule: {add} device(s) join after step {obs.step}",
                        ScaleEstimate(_lag(obs), _gain(obs, add)), signal=True)


class ScaleController:
    """Hysteresis scale-out controller; see the module docstring. `limit`: instances it may add."""

    def __init__(self, cfg: ScaleConfig, limit: int):
        self.cfg = cfg
        self.limit = limit
        self.added = 0
        self.hysteresis = Hysteresis(cfg.cooldown_steps, cfg.consecutive)

    def observe(self, obs: ScaleObservation, now: float) -> ScaleDecision:
        cfg = self.cfg
        lag = _lag(obs)
        signal = lag > cfg.threshold
        self.hysteresis.count(signal)

        def decide(action: str, reason: str, add: int = 0) -> ScaleDecision:
            return Decision(obs.step, now, action, obs.instances, obs.instances + add, reason,  # type: ignore[arg-type]
                            ScaleEstimate(lag, _gain(obs, max(1, add))), signal)

        if cooling := self.hysteresis.cooldown(obs.step, "join"):
            return decide("hold", f"{cooling} (generation lags {lag:+.0%})")
        if not signal:
            return decide("hold", f"generation keeps up: rollout {obs.rollout_s:.1f}s vs train "
                                  f"{obs.train_s:.1f}s ({lag:+.0%}, threshold +{cfg.threshold:.0%})")
        if short_run := self.hysteresis.short_run():
            return decide("hold", f"generation lags {lag:+.0%}: {short_run}")
        if self.added >= self.limit:
            return decide("hold", f"generation lags {lag:+.0%} but the reserve is spent "
                                  f"({self.added} of {self.limit} instances added)")
        self.added += 1
        self.hysteresis.moved(obs.step)
        return decide("add", f"generation lags training by {lag:.0%} for {cfg.consecutive} steps "
                             f"(rollout {obs.rollout_s:.1f}s vs train {obs.train_s:.1f}s): "
                             f"{obs.instances} -> {obs.instances + 1} instances", 1)


def make_scale_policy(cfg: ScaleConfig, reserve_instances: int) -> ScalePolicy:
    """The scale policy of a job or a simulation (the same object in `poise train` and
    `poise simulate`): the pool holds, follows a schedule, or the controller decides."""
    if cfg.schedule:
        return ScheduledJoins(cfg.scheduled())
    if cfg.policy == "controller":
        return ScaleController(cfg, cfg.most_added(reserve_instances))
    return StaticPool()


__all__ = ["ScaleConfig", "ScaleObservation", "ScaleDecision", "ScaleEstimate", "ScalePolicy", "StaticPool",
           "ScheduledJoins", "ScaleController", "make_scale_policy", "first_step_served"]
