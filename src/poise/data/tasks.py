"""Built-in verifiable tasks with long-tailed answer lengths, and the task mix over training.

Three families (answer lengths in characters of the reference answer):

- `arith`: "arith 7+12" -> "19"                      1-2 characters
- `span`:  "span 3 9"   -> "3 4 5 6 7 8 9"            heavy-tailed (Pareto span size), up to ~50
- `sort`:  "sort 5 2 9 1" -> "1 2 5 9"                heavy-tailed (Pareto list size), up to ~31
- `count`: "count 3:9="  -> "3 4 5 6 7 8 9"            uniform span of 2-12 numbers (the peer benchmark's task)
- `guess`: "guess 1-7"  -> "5"                        multi-turn (env.name: guess): the model guesses, the
                                                      environment says higher or lower; the last guess is scored

Rewards are exact and in [0, 1]: `arith` is exact match; `span` and `sort` score the fraction of
positions that hold the right item, divided by the longer of the two lists, so only the exact
answer scores 1. Pure Python (no torch): the simulator and the rankers use these problems too.

Prompts of step k are a pure function of (seed, phase pools, k): each phase owns a pool of
problems drawn from its mix, iterated in epochs with a seeded shuffle per epoch, so a prompt
recurs once per epoch (the history ranker relies on that, StreamRL §5.2).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Callable

from poise.config.data import FAMILIES, Phase, validate_phases
from poise.errors import ConfigError
from poise.rewards.builtin import SCALAR, exact_score, items_score

GUESS_RANGE = (1, 7)  # `guess`: the hidden number's range; binary search finds any in 3 turns


@dataclass(frozen=True)
class Problem:
    """One prompt with its verifiable reference answer."""

    uid: str  # stable id within its pool, e.g. "p0-000123"
    family: str  # "arith" | "span" | "sort" | "dataset"
    prompt: str
    answer: str
    reward_name: str  # key of REWARDS
    # a dataset row's other columns, by name (user reward functions receive them); not hashed
    columns: dict[str, object] = field(default_factory=dict, hash=False)
    origin: str = field(default="", compare=False)  # where a dataset row came from: "file:line" or "file:row N"


def derive_seed(*parts: object) -> int:
    """A 63-bit seed that is a pure function of `parts` (stable across processes, unlike hash())."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _pareto_int(rng: random.Random, low: int, high: int, alpha: float) -> int:
    """Heavy-tailed integer in [low, high]: low * U^(-1/alpha), rounded down, clipped."""
    u = 1.0 - rng.random()  # (0, 1]
    return min(high, int(low * u ** (-1.0 / alpha)))


def make_problem(family: str, rng: random.Random, uid: str) -> Problem:
    if family == "arith":
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        return Problem(uid, family, f"arith {a}+{b}", str(a + b), "exact")
    if family == "span":
        size = _pareto_int(rng, 2, 24, alpha=1.1)
        start = rng.randint(0, 30)
        answer = " ".join(str(i) for i in range(start, start + size))
        return Problem(uid, family, f"span {start} {start + size - 1}", answer, "items")
    if family == "sort":
        size = _pareto_int(rng, 2, 16, alpha=1.1)
        items = [rng.randint(0, 9) for _ in range(size)]
        prompt = "sort " + " ".join(map(str, items))
        return Problem(uid, family, prompt, " ".join(map(str, sorted(items))), "items")
    if family == "guess":  # a multi-turn task (env.name: guess): the answer is hidden from the prompt
        low, high = GUESS_RANGE
        return Problem(uid, family, f"guess {low}-{high}", str(rng.randint(low, high)), "exact")
    if family == "count":
        start = rng.randint(0, 40)
        end = start + rng.randint(1, 11)
        return Problem(uid, family, f"count {start}:{end}=", " ".join(str(i) for i in range(start, end + 1)), "items")
    raise ConfigError("data.phases[].mix", family, f"unknown task family; choose from {', '.join(FAMILIES)}")


# The per-row kinds live with the reward functions (poise.rewards.builtin); runs score through the
# reward sandbox, whose default function `task` applies these same kinds.
reward_exact = exact_score
reward_items = items_score
REWARDS: dict[str, Callable[[str, str], float]] = SCALAR


def reward(problem: Problem, response: str) -> float:
    """The problem's reward for `response`, in [0, 1]."""
    return REWARDS[problem.reward_name](problem.answer, response)


def default_phases() -> tuple[Phase, ...]:
    """The built-in mix: mostly short arithmetic with a long tail of spans and sorts."""
    return (Phase(mix={"arith": 0.5, "span": 0.25, "sort": 0.25}),)


class TaskSource:
    """Deterministic prompts per step: `prompts_for_step(k, n)` is a function of (seed, k, n)."""

    def __init__(self, seed: int, phases: tuple[Phase, ...] | None = None, pool_size: int = 512):
        self.seed = seed
        self.phases = tuple(phases) if phases else default_phases()
        validate_phases(self.phases)
        if pool_size < 1:
            raise ConfigError("data.pool_size", pool_size, "must be >= 1")
        self.pool_size = pool_size
        self._pools: dict[int, list[Problem]] = {}
        self._orders: dict[tuple[int, int], list[int]] = {}  # the last epoch's order (steps ask in order)

    def pool(self, phase_index: int) -> list[Problem]:
        if phase_index not in self._pools:
            phase = self.phases[phase_index]
            rng = random.Random(derive_seed("pool", self.seed, phase_index))
            names = sorted(phase.mix)
            weights = [phase.mix[n] for n in names]
            self._pools[phase_index] = [
                make_problem(rng.choices(names, weights)[0], rng, f"p{phase_index}-{i:06d}")
                for i in range(self.pool_size)
            ]
        return self._pools[phase_index]

    def phase_of(self, step: int) -> tuple[int, int]:
        """(phase index, first step of that phase) for `step`."""
        start = 0
        for i, phase in enumerate(self.phases):
            if phase.until_step is None or step < phase.until_step:
                return i, start
            start = phase.until_step
        return len(self.phases) - 1, start  # unreachable after validation

    def _order(self, phase_index: int, epoch: int) -> list[int]:
        key = (phase_index, epoch)
        if key not in self._orders:  # one shuffle per epoch, not one per prompt drawn
            order = list(range(self.pool_size))
            random.Random(derive_seed("epoch", self.seed, phase_index, epoch)).shuffle(order)
            self._orders = {key: order}
        return self._orders[key]

    def prompts_for_step(self, step: int, n: int) -> list[Problem]:
        phase_index, start = self.phase_of(step)
        pool = self.pool(phase_index)
        first = (step - start) * n
        out = []
        for pos in range(first, first + n):
            epoch, offset = divmod(pos, self.pool_size)
            out.append(pool[self._order(phase_index, epoch)[offset]])
        return out

    def prompt_for_draw(self, step: int, draw: int) -> Problem:
        """Dynamic sampling's extra draw `draw` (>= prompts_per_step) of step `step`: a problem of the
        step's phase pool chosen by (seed, step, draw) alone."""
        pool = self.pool(self.phase_of(step)[0])
        return pool[random.Random(derive_seed("draw", self.seed, step, draw)).randrange(len(pool))]


class DatasetSource:
    """Prompts from a user dataset (rows of `poise.data.dataset`), in seeded epochs like TaskSource."""

    def __init__(self, seed: int, problems: list[Problem]):
        if not problems:
            raise ConfigError("data.dataset", "(empty)", "the dataset has no rows")
        self.seed = seed
        self.problems = problems
        self._orders: dict[int, list[int]] = {}  # the last epoch's order

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:  # one shuffle per epoch, not one per prompt drawn
            order = list(range(len(self.problems)))
            random.Random(derive_seed("dataset-epoch", self.seed, epoch)).shuffle(order)
            self._orders = {epoch: order}
        return self._orders[epoch]

    def prompts_for_step(self, step: int, n: int) -> list[Problem]:
        out = []
        for pos in range(step * n, step * n + n):
            epoch, offset = divmod(pos, len(self.problems))
            out.append(self.problems[self._order(epoch)[offset]])
        return out

    def prompt_for_draw(self, step: int, draw: int) -> Problem:
        """Dynamic sampling's extra draw `draw` of step `step`: a row chosen by (seed, step, draw) alone."""
        return self.problems[random.Random(derive_seed("draw", self.seed, step, draw)).randrange(len(self.problems))]


__all__ = [
    "FAMILIES", "Problem", "Phase", "TaskSource", "DatasetSource", "REWARDS", "reward",
    "make_problem", "default_phases", "validate_phases", "derive_seed",
]
