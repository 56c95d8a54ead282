"""The environment protocol: what user code implements to run multi-turn episodes.

An environment is a class named by import path (`env.class: module:Class`); Poise builds it with
the keyword arguments of `env.args` and drives it like a gym environment:

    env = Class(**args)
    first_observation = env.reset(row, seed)          # str: appended after the prompt
    observation, reward, done, info = env.step(action_text)

`row` is the problem: its `prompt`, `answer` and a dataset row's other columns. `seed` is a pure
function of (run seed, sample id): an environment that draws randomness must draw it from a
`random.Random(seed)` of its own, so an episode is the same on every device and after a restart.
`step` gets the text of one model turn and returns the observation that follows it (appended to
the episode, trained on by nobody), the turn's reward, whether the episode is over, and a dict of
JSON-able facts (logged). A `StepResult` may be returned instead of the tuple.

Environments run in the reward sandbox: user code, and the model's actions are adversarial.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, runtime_checkable


@dataclass(frozen=True)
class StepResult:
    observation: str
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    def reset(self, row: Mapping[str, Any], seed: int) -> str: ...

    def step(self, action: str) -> StepResult | tuple[str, float, bool, dict[str, Any]]: ...


__all__ = ["Environment", "StepResult"]
