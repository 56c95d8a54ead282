"""The hold rules both controllers share (controller.py moves devices between splits, scale.py adds
rollout instances): no move within `cooldown_steps` steps of the last one, and a signal that must
fire `consecutive` steps in a row, pointing the same way, before a move. The controllers add their
own rules (dwell, break-even, the reserve) and word their reasons around these."""

from __future__ import annotations


class Hysteresis:
    def __init__(self, cooldown_steps: int, consecutive: int):
        self.cooldown_steps = cooldown_steps
        self.consecutive = consecutive
        self.last_move_step: int | None = None
        self.run_len = 0  # steps in a row the signal has fired toward `run_direction`
        self.run_direction = 0
        self.run_start = 0.0  # run time at which the current run began

    def count(self, signal: bool, direction: int = 0, start: float = 0.0) -> None:
        """One step's signal: a run goes on while the signal fires toward the same `direction`; a
        new run begins at `start`."""
        if signal and direction == self.run_direction:
            self.run_len += 1
        elif signal:
            self.run_direction, self.run_len, self.run_start = direction, 1, start
        else:
            self.run_direction, self.run_len = 0, 0

    def cooldown(self, step: int, move: str) -> str | None:
        """Why no `move` may happen at `step` yet; None once the cooldown is over."""
        if self.last_move_step is None or step - self.last_move_step > self.cooldown_steps:
            return None
        return f"cooldown: {step - self.last_move_step} of {self.cooldown_steps} steps since the last {move}"

    def short_run(self) -> str | None:
        """The signal's run while it is shorter than `consecutive` steps; None once it is long enough."""
        return f"signal {self.run_len}/{self.consecutive}" if self.run_len < self.consecutive else None

    def moved(self, step: int) -> None:
        """A move happened after `step`: the cooldown starts and the signal counts again from zero."""
        self.last_move_step = step
        self.run_direction, self.run_len = 0, 0
