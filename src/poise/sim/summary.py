"""What a simulated run reports: a record per step, the run's summary, and the resize break-even
measured from the step times. Torch-free.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from poise.policy.split import Split


@dataclass
class StepRecord:
    step: int
    split: Split
    gen_start: float
    gen_end: float
    train_start: float
    train_end: float
    rollout_s: float
    train_s: float
    sync_s: float
    step_s: float
    tokens: int
    resize_s: float = 0.0
    samples: int = 0  # samples the step trained


@dataclass
class Summary:
    scenario: str
    mode: str
    steps: int
    total_s: float
    output_tokens: int
    tokens_per_s: float
    step_s_mean: float
    step_s_median: float
    rollout_s_mean: float
    train_s_mean: float
    idle_fraction: dict[str, float]
    initial_split: list[int]
    final_split: list[int]
    resizes: list[dict[str, Any]] = field(default_factory=list)
    break_even_steps: float | None = None  # predicted by the controller, first resize
    break_even_steps_measured: float | None = None
    joins: list[dict[str, Any]] = field(default_factory=list)  # elastic scale-out (scale:)
    device_s: float = 0.0  # device-seconds held: the pool for the whole run, a joined device from its join
    tokens_per_device_s: float = 0.0
    samples_per_s: float = 0.0  # trained samples per second
    tokens_by_lag: dict[int, int] = field(default_factory=dict)  # trained output tokens by staleness (versions)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)



def measured_break_even(step_s: list[float], decided_after: int, cost_s: float, window: int = 5) -> float | None:
    """Resize cost over the measured per-step gain: median step time of the `window` steps up to
    the decision minus that of the `window` steps after the step that absorbed the resize."""
    before = step_s[max(0, decided_after - window + 1): decided_after + 1]
    after = step_s[decided_after + 2: decided_after + 2 + window]
    if not before or not after:
        return None
    gain = statistics.median(before) - statistics.median(after)
    return cost_s / gain if gain > 0 else math.inf
