"""A controller's decision after one step: hold the current state, or move to a target one, with
its reason. The resize controller (controller.py) moves devices between splits; the scale
controller (scale.py) adds rollout instances. Both log every decision as a `decision` event
(docs/events.md): the fields they share, then their own estimate's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from poise.config.split import Split


class Estimate(Protocol):
    """What a controller predicted when it decided; `what` names the controller in the event."""

    what: str

    def event_fields(self) -> dict: ...


S = TypeVar("S", Split, int)  # the state a controller moves: a split, or a count of rollout instances
E = TypeVar("E", bound=Estimate)


@dataclass(frozen=True)
class Decision(Generic[S, E]):
    step: int
    now: float
    action: Literal["hold", "resize", "add"]
    current: S
    target: S  # the current state when the action is hold
    reason: str
    estimate: E
    signal: bool = False  # whether the controller's signal fired at this step

    def event_fields(self) -> dict:
        """The `decision` event of docs/events.md."""
        return {"what": self.estimate.what, "action": self.action, "step": self.step,
                "from": _logged(self.current), "to": _logged(self.target), "reason": self.reason,
                **self.estimate.event_fields()}


def _logged(state: Split | int) -> list[int] | int:
    return state.as_list() if isinstance(state, Split) else state
