"""The built-in multi-turn task's environment: guess a hidden number, told higher or lower.

The row's `answer` is the number (data/tasks.py family `guess`, within GUESS_RANGE); each model
turn is a guess. A wrong guess is answered "higher" or "lower", a right one ends the episode; the
run's reward (the built-in `exact`) scores the last guess, so an episode pays 1 when the model
finds the number within env.max_turns turns. Binary search always does in 3 turns over 1-7; a
guess that ignores the feedback does in about half the episodes: the task needs the turns.
"""

from __future__ import annotations

from typing import Any, Mapping

from poise.episodes.protocol import StepResult


class GuessEnv:
    def reset(self, row: Mapping[str, Any], seed: int) -> str:
        self.target = int(row["answer"])
        return ""

    def step(self, action: str) -> StepResult:
        text = action.strip()
        if not text.isdigit():
            return StepResult("say a number", 0.0, False, {"valid": False})
        guess = int(text)
        if guess == self.target:
            return StepResult("correct", 0.0, True, {"valid": True})
        return StepResult("higher" if self.target > guess else "lower", 0.0, False, {"valid": True})
