"""Resize controller (DynaResize §3.4): decides, once per step, whether to move devices between
the rollout and train roles, and to which allowed split.

Interface (runtime driver, simulator):

    ctl = ResizeController(ControllerConfig(...), cost, pipeline_mode="async",
                           resize_mode="live", allowed=[Split(6, 2), Split(4, 4)],
                           devices_per_instance=1, batch_cap=64)
    decision = ctl.observe(StepObservation(step, now, split, rollout_s, train_s, step_s,
                                           output_lengths, prompt_len))
    if decision.action == "resize": apply decision.target   # the controller assumes it is applied

The driver should not call `observe` for the step that absorbed a resize (it mixes two splits);
the cooldown holds anyway.

Every decision (policy/decision.py) carries a human-readable `reason` and a `ResizeEstimate`: the
predicted gain per step, the predicted resize cost and the break-even step count; it is logged as
a `decision` event.

The signal. The cost model prices every allowed split on each step's output lengths (averaged
over the last `window` steps); its stage times are calibrated to the observed ones (observed /
predicted at the observed split; the weight sync too where the driver measured it), so a model
that is wrong by a constant factor still ranks splits correctly. The signal is the relative gain of the best split over the current one. The paper's signal is the raw
imbalance between stage times; ours is equivalent for the async pipeline (where the step is
the slower stage) and also right for sync, where balancing stages is not the goal.

The filters, in the order they are applied (each can hold the split, with its reason; the
cooldown and the consecutive count are policy/hysteresis.py's, shared with scale.py):
  cooldown     no resize within `cooldown_steps` steps of the previous one
  threshold    predicted gain below `threshold` of the current step time: balanced
  consecutive  the signal must point the same way (more rollout / more train) `consecutive`
               steps in a row; the target is the best split at the last one
  dwell        ... and the signal must have lasted `dwell_s` seconds of run time
  break-even   gain per step x expected persistence must exceed the resize cost
Expected persistence: how many more steps the current regime will last. A regime is a run of
steps over which the same split stays within `regime_margin` of the best one (so near-ties
between two good splits do not end it). The estimate is the typical regime length minus this
regime's age, but at least its age (a regime that has outlived the typical one is expected to
last about as long again); the typical length is `persistence_prior_steps` until a regime has
ended, then the mean length of the ended regimes. Departure from the paper, which sets a
>10-step cooldown from the measured break-even of its one workload (the circularity its
reviewers flagged): ours checks break-even against the workload's own observed persistence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, Sequence

from poise.config.policy import ControllerConfig, ResizeConfig
from poise.policy.allocator import StepWorkload, compose_step, predict_step
from poise.policy.cost import CostModel
from poise.policy.decision import Decision
from poise.policy.hysteresis import Hysteresis
from poise.policy.split import Split, parse_splits
from poise.policy.turns import EpisodeWork
from poise.schema import check




class ScheduledResizes:
    """A forced schedule, with the controller's interface: at the end of step k it resizes to the
    split scheduled for step k+1 (tests and benchmarks; `resize.schedule`)."""

    def __init__(self, schedule: dict[int, Split]):
        self.schedule = dict(schedule)

    def observe(self, obs: StepObservation) -> ResizeDecision:
        target = self.schedule.get(obs.step + 1)
        if target is None or target == obs.split:
            return Decision(obs.step, obs.now, "hold", obs.split, obs.split, "no resize scheduled",
                            ResizeEstimate())
        return Decision(obs.step, obs.now, "resize", obs.split, target,
                        f"resize.schedule: step {obs.step + 1} runs on {target.rollout}+{target.train}",
                        ResizeEstimate(), signal=True)

    def resized(self, critical_path_s: float) -> None:
        pass


NO_HYSTERESIS = ControllerConfig(threshold=0.05, consecutive=1, dwell_s=0.0, cooldown_steps=0,
                                 break_even=False)


@dataclass(frozen=True)
class StepObservation:
    """What the driver saw in one step. Times in seconds; `now` is run time at the step's end."""

    step: int
    now: float
    split: Split
    rollout_s: float
    train_s: float
    step_s: float
    output_lengths: tuple[int, ...]
    prompt_len: int
    sync_s: float | None = None  # measured weight sync; None: the cost model's
    episodes: tuple[EpisodeWork, ...] = ()  # an agent job's episodes (policy/turns.py), priced turn by turn
    slots: str = "refill"  # their slot rule


@dataclass(frozen=True)
class ResizeEstimate:
    """What the resize controller predicted when it decided (the hold of a static split or a
    schedule predicts nothing)."""

    what: ClassVar[str] = "resize"
    predicted_gain_s: float = 0.0  # per step, best split vs current
    predicted_cost_s: float = 0.0  # resize critical path
    break_even_steps: float | None = None
    expected_persistence_steps: float | None = None
    predictions: dict[str, float] = field(default_factory=dict)  # split -> predicted step s

    def event_fields(self) -> dict:
        return {"predicted_gain_s": self.predicted_gain_s, "predicted_cost_s": self.predicted_cost_s,
                "break_even_steps": self.break_even_steps,
                "expected_persistence_steps": self.expected_persistence_steps,
                "predicted_step_s": dict(self.predictions)}


ResizeDecision = Decision[Split, ResizeEstimate]


class ResizePolicy(Protocol):
    """What a driver calls once per step: `ResizeController` or `StaticSplit`; and after each
    resize, with what its critical path measured."""

    def observe(self, obs: StepObservation) -> ResizeDecision: ...

    def resized(self, critical_path_s: float) -> None: ...


class StaticSplit:
    """Never resizes (the static baseline), with the same interface as the controller."""

    def observe(self, obs: StepObservation) -> ResizeDecision:
        return Decision(obs.step, obs.now, "hold", obs.split, obs.split, "static split", ResizeEstimate())

    def resized(self, critical_path_s: float) -> None:
        pass


class ResizeController:
    """Hysteresis resize controller; see the module docstring."""

    def __init__(self, cfg: ControllerConfig, cost: CostModel, pipeline_mode: str,
                 resize_mode: str, allowed: Sequence[Split], devices_per_instance: int = 1,
                 batch_cap: int = 64, micro_batches: int = 8):
        self.cfg = cfg
        self.cost = cost
        self.pipeline_mode = pipeline_mode
        self.resize_cost = cost.resize(resize_mode)
        self.allowed = tuple(allowed)
        self.devices_per_instance = devices_per_instance
        self.batch_cap = batch_cap
        self.micro_batches = micro_batches
        self.hysteresis = Hysteresis(cfg.cooldown_steps, cfg.consecutive)
        self._regime: Split | None = None
        self._regime_start = 0
        self.ended_regimes: list[int] = []
        self._recent: list[dict[Split, float]] = []
        self.measured_costs: list[float] = []  # critical paths of this job's own resizes

    def resized(self, critical_path_s: float) -> None:
        """A resize this controller asked for took `critical_path_s` (measured by the driver): the
        break-even check prices the next one at the median measured, not the model's price."""
        self.measured_costs.append(critical_path_s)

    def resize_cost_s(self) -> float:
        if self.measured_costs:
            ordered = sorted(self.measured_costs)
            return ordered[len(ordered) // 2]
        return self.resize_cost.critical_path_s

    def predictions(self, obs: StepObservation) -> dict[Split, float]:
        """Predicted step seconds of every allowed split (and the current one) for the workload
        of `obs`, calibrated so the observed split's stage times equal the observed ones."""
        work = StepWorkload(obs.output_lengths, obs.prompt_len, obs.episodes, obs.slots)
        splits = set(self.allowed) | {obs.split}
        raw = {s: predict_step(self.cost, work, s, self.pipeline_mode, self.devices_per_instance,
                               self.batch_cap, self.micro_batches) for s in splits}
        cur = raw[obs.split]
        r_scale = obs.rollout_s / cur.rollout_s if cur.rollout_s > 0 else 1.0
        t_scale = obs.train_s / cur.train_s if cur.train_s > 0 else 1.0
        s_scale = obs.sync_s / cur.sync_s if obs.sync_s is not None and cur.sync_s > 0 else 1.0
        out = {}
        for s, p in raw.items():
            tail = None
            if self.pipeline_mode == "stream":
                tail = max(0.0, p.step_s - p.sync_s - p.rollout_s) * t_scale
            out[s] = compose_step(self.pipeline_mode, p.rollout_s * r_scale, p.train_s * t_scale,
                                  p.sync_s * s_scale, tail)
        return out

    def _smoothed(self, obs: StepObservation) -> dict[Split, float]:
        """Predictions averaged over the last `window` steps (each calibrated at its own split)."""
        self._recent.append(self.predictions(obs))
        del self._recent[:-self.cfg.window]
        keys = set(self.allowed) | {obs.split}
        return {s: sum(p.get(s, math.inf) for p in self._recent) / len(self._recent) for s in keys}

    def observe(self, obs: StepObservation) -> ResizeDecision:
        cfg = self.cfg
        preds = self._smoothed(obs)
        cur_s = preds[obs.split]
        best = min(self.allowed or (obs.split,), key=lambda s: (round(preds[s], 9), s != obs.split))
        gain = max(0.0, cur_s - preds[best])
        signal = best != obs.split and cur_s > 0 and gain / cur_s >= cfg.threshold
        table = {str(s): round(v, 3) for s, v in sorted(preds.items())}
        cost_s = self.resize_cost_s()

        # Regime: the split the workload wants. Sticky, so near-ties between two good splits
        # do not end it: it ends only when another split beats it by `regime_margin` (kept
        # apart from the signal threshold: a low threshold must not shorten the regimes).
        if self._regime is None:
            self._regime, self._regime_start = best, obs.step
        elif preds.get(self._regime, math.inf) > preds[best] * (1.0 + cfg.regime_margin):
            self.ended_regimes.append(obs.step - self._regime_start)
            self._regime, self._regime_start = best, obs.step
        age = obs.step - self._regime_start + 1
        typical = (sum(self.ended_regimes) / len(self.ended_regimes) if self.ended_regimes
                   else cfg.persistence_prior_steps)
        # A regime that has already outlived the typical one is expected to last about as long
        # again (Lindy): without this floor a long first regime would exhaust the prior and
        # the controller would never resize.
        persistence = float(max(typical - age, age))

        # Consecutive signals count by direction (+1 more rollout, -1 more train), so a target
        # that wavers between two neighbouring splits still builds up the count.
        direction = (best.rollout > obs.split.rollout) - (best.rollout < obs.split.rollout)
        self.hysteresis.count(signal, direction, obs.now - obs.step_s)
        break_even = cost_s / gain if gain > 0 else None

        def decide(action: str, reason: str) -> ResizeDecision:
            return Decision(obs.step, obs.now, action, obs.split, best if action == "resize" else obs.split,  # type: ignore[arg-type]
                            reason, ResizeEstimate(gain, cost_s, break_even, persistence, table), signal)

        if cooling := self.hysteresis.cooldown(obs.step, "resize"):
            return decide("hold", cooling)
        if not signal:
            return decide("hold", f"balanced: best split {best} predicts {gain:.3g}s/step gain "
                                  f"({gain / cur_s if cur_s else 0:.0%}) < threshold {cfg.threshold:.0%}")
        if short_run := self.hysteresis.short_run():
            return decide("hold", f"{short_run} toward {best} ({gain:.3g}s/step)")
        lasted = obs.now - self.hysteresis.run_start
        if lasted < cfg.dwell_s:
            return decide("hold", f"dwell: signal toward {best} has lasted {lasted:.0f}s of "
                                  f"{cfg.dwell_s:.0f}s")
        if cfg.break_even and gain * persistence <= cost_s:
            return decide("hold", f"break-even: resize to {best} costs {cost_s:.3g}s = "
                                  f"{break_even:.1f} steps of {gain:.3g}s gain, expect "
                                  f"{persistence:.1f} more steps of this regime")
        self.hysteresis.moved(obs.step)
        self._recent.clear()  # observations at the old split say little about the new one
        return decide("resize", f"{obs.split} -> {best}: predicted {cur_s:.3g}s -> {preds[best]:.3g}s "
                                f"per step, {self.resize_cost.mode} resize {cost_s:.3g}s pays back in "
                                f"{break_even:.1f} steps; expect {persistence:.1f} more steps")


def make_resize_policy(resize: ResizeConfig, controller: ControllerConfig, cost: CostModel, pipeline_mode: str,
                       devices: int, devices_per_instance: int = 1, batch_cap: int = 64,
                       micro_batches: int = 8) -> ResizePolicy:
    """The resize policy of a job or a simulation: the split holds, follows a schedule, or the
    controller decides (the same object in `poise train` and `poise simulate`)."""
    if resize.schedule:
        return ScheduledResizes(resize.scheduled())
    if resize.policy == "controller":
        from poise.policy.split import all_splits

        allowed = parse_splits(resize.allowed_splits, "resize.allowed_splits") or \
            tuple(all_splits(devices, devices_per_instance))
        return ResizeController(controller, cost, pipeline_mode, resize.mode, allowed, devices_per_instance,
                                batch_cap, micro_batches)
    return StaticSplit()
