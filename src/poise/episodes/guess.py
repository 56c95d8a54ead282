"""The built-in multi-turn task's environment: guess a hidden number, told higher or lower.

The row's `answer` is the number (data/tasks.py family `guess`, within GUESS_RANGE); each model
turn is a guess. A wrong guess is answered "higher" or "lower", a right one ends the episode; the
run's reward (the built-in `exact`) scores the last guess, so an episode pays 1 when the model
finds the number within env.max_turns turns. Binary search always does in 3 turns over 1-7; a
guess that ignores the feedback does in about half the episodes: the task needs the turns.
"""

from __future__ import annotations

import random
from typing import Any, Mapping

from poise.data.tasks import GUESS_RANGE
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


def transcript(target: int, rng: random.Random, low: int = GUESS_RANGE[0], high: int = GUESS_RANGE[1]
               ) -> list[tuple[str, str]]:
    """A warm start's play (train/sft.py): each guess drawn uniformly from the numbers the feedback so
    far allows, until the right one: [(guess, observation), ...], the last observation "" (it ends).
    Consistent but not clever: binary search is what RL has to find."""
    turns = []
    while True:
        guess = rng.randint(low, high)
        if guess == target:
            turns.append((str(guess), ""))
            return turns
        turns.append((str(guess), "higher" if target > guess else "lower"))
        low, high = (guess + 1, high) if target > guess else (low, guess - 1)
