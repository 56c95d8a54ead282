"""How busy a rollout engine is: its running sequences (those in slots) and its queued ones, read
together (`RolloutEngine.occupancy`), and the one message of a call that needs an idle engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Occupancy:
    running: int
    queued: int

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.queued == 0

    def busy(self, call: str) -> str:
        """Why `call` is refused while sequences run or wait."""
        return f"{call} needs an idle engine; {self.running} running and {self.queued} queued"
