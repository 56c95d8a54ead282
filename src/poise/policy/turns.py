"""Multi-turn episodes on continuous batching: when each episode's turns run and when it ends.

An episode (docs/design.md, Episodes) is a prompt, then model turns and environment observations
alternating. Each model turn is a request on a rollout instance; after it the environment works
for `env_s[i]` seconds (in the sandbox, off the device) and its observation joins the episode.
What the engine slot does meanwhile is the slot rule:

    refill  (Poise, what the runtime does) the finished turn frees its slot at once, so other
            episodes decode during the environment's wait; the next turn is a new request, queued
            on the least busy instance (fewest live, held and queued; the runtime's
            `submit_turns`), and its prefill is the whole episode so far.
    hold    (the naive scheme some peers use; for comparison) the episode keeps its slot, idle,
            through every environment wait, and its KV cache with it: the next turn prefills
            only the observation, on the same instance; the slot frees when the last call answers.

`episode_times` runs every instance's `ContinuousBatch` on one event queue: a turn may move
between instances, so they are not independent as in `instance_finish_times`. A turn that arrives
while its instance decodes joins at the next decode step (`ContinuousBatch.advance(limit_s)`).
With one turn and no environment time an episode is a plain request, timed exactly as
`instance_finish_times` times it. Pure: times are arguments and results, nothing reads a clock.

Departure from the runtime: the environment's reset (before the first turn) is not priced; every
first turn is queued at its instance's start.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Literal, Sequence

from poise.errors import ConfigError
from poise.policy.cost import ContinuousBatch, CostModel

SlotRule = Literal["refill", "hold"]
SLOT_RULES = ("refill", "hold")
_WAKE, _ANSWER = 0, 1  # event kinds: an instance's next finish; an environment's answer


@dataclass(frozen=True)
class EpisodeWork:
    """One episode's rollout work: the model tokens of each turn, the observation tokens the
    environment appends after each turn but the last, and each environment call's seconds (one
    after every turn; the last one says the episode is done)."""

    prompt_len: int
    turns: tuple[int, ...]
    observations: tuple[int, ...]
    env_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.turns or min(self.turns) < 1:
            raise ConfigError("episode turns", list(self.turns), "give at least one model turn of >= 1 token")
        if len(self.observations) != len(self.turns) - 1 or min(self.observations, default=0) < 0:
            raise ConfigError("episode observations", list(self.observations),
                              f"give {len(self.turns) - 1} token counts >= 0 (one after each turn but the last)")
        if len(self.env_s) != len(self.turns) or min(self.env_s) < 0:
            raise ConfigError("episode env_s", list(self.env_s),
                              f"give {len(self.turns)} seconds >= 0 (one call after each turn)")

    @property
    def model_tokens(self) -> int:
        return sum(self.turns)

    @property
    def tokens(self) -> int:
        """The trained sequence: prompt, every turn and every observation."""
        return self.prompt_len + self.model_tokens + sum(self.observations)

    def context(self, turn: int) -> int:
        """Tokens before model turn `turn`: the prompt, earlier turns and their observations."""
        return self.prompt_len + sum(self.turns[:turn]) + sum(self.observations[:turn])


@dataclass(frozen=True)
class EpisodeTimes:
    finish: list[float]  # per episode: its last environment call answered (the sample is whole)
    instance: list[int]  # per episode: the instance of its last turn
    turn_finish: list[list[float]]  # per episode, per turn: when the model turn finished
    busy_s: list[float]  # per instance: seconds it prefilled or decoded
    slot_s: list[float]  # per instance: decode seconds times the sequences decoding then (slot-seconds used)
    end: list[float]  # per instance: when its last turn finished (its start if it ran none)


class _Instance:
    def __init__(self, cost: CostModel, cap: int, start: float):
        self.batch = ContinuousBatch(cost, cap)
        self.t = start  # the instance's own time: where its committed work ends
        self.end = start
        self.queue: deque[tuple[int, int]] = deque()  # (episode, turn), FIFO
        self.held = 0  # slots kept by episodes waiting for their environment (hold)
        self.busy = 0.0
        self.slot_s = 0.0
        self.version = 0  # bumps whenever its next finish is rescheduled

    @property
    def load(self) -> int:
        return self.batch.live + self.held + len(self.queue)

    @property
    def free(self) -> int:
        return self.batch.free - self.held


class _Schedule:
    """The event loop of `episode_times`: instance finishes and environment answers in time order."""

    def __init__(self, cost: CostModel, episodes: Sequence[EpisodeWork], caps: Sequence[int], rule: str,
                 starts: Sequence[float]):
        self.episodes, self.rule = episodes, rule
        self.inst = [_Instance(cost, cap, t) for cap, t in zip(caps, starts)]
        self.events: list[tuple[float, int, int, int, int]] = []  # (time, seq, kind, a, b)
        self.seq = 0
        self.where = [0] * len(episodes)  # instance of each episode's latest turn
        self.finish = [0.0] * len(episodes)
        self.turn_finish = [[0.0] * len(e.turns) for e in episodes]

    def run(self, queues: Sequence[Sequence[int]]) -> EpisodeTimes:
        for i, queue in enumerate(queues):
            self.inst[i].queue.extend((ep, 0) for ep in queue)
            self.admit(i)
        while self.events:
            t, _, kind, a, b = heapq.heappop(self.events)
            if kind == _WAKE:
                if b == self.inst[a].version:
                    live = self.inst[a].batch.live
                    seconds, done = self.inst[a].batch.advance()
                    self.ran(a, seconds, done, live)
                    self.admit(a)
            else:
                self.answered(a, b, t)
        return EpisodeTimes(self.finish, list(self.where), self.turn_finish, [i.busy for i in self.inst],
                            [i.slot_s for i in self.inst], [i.end for i in self.inst])

    def push(self, t: float, kind: int, a: int, b: int) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, a, b))
        self.seq += 1

    def ran(self, i: int, seconds: float, done: list[tuple[int, int]], live: int) -> None:
        """Instance `i` decoded `seconds` with `live` sequences; the turns in `done` finished then and
        call their environment."""
        inst = self.inst[i]
        inst.t += seconds
        inst.busy += seconds
        inst.slot_s += seconds * live
        for ep, turn in done:
            self.turn_finish[ep][turn] = inst.end = inst.t
            if self.rule == "hold":
                inst.held += 1
            self.push(inst.t + self.episodes[ep].env_s[turn], _ANSWER, ep, turn)

    def admit(self, i: int) -> None:
        """Fill instance `i`'s free slots from its queue (each admission prefills), then schedule
        its next finish."""
        inst = self.inst[i]
        while inst.queue and inst.free > 0:
            ep, turn = inst.queue.popleft()
            e = self.episodes[ep]
            cached = self.rule == "hold" and turn > 0  # the slot kept the episode's KV cache
            seconds = inst.batch.admit((ep, turn), e.context(turn), e.turns[turn],
                                       e.observations[turn - 1] if cached else None)
            inst.t += seconds
            inst.busy += seconds
            self.where[ep] = i
        inst.version += 1
        if inst.batch.live:
            self.push(inst.t + inst.batch.next_finish_s(), _WAKE, i, inst.version)

    def answered(self, ep: int, turn: int, t: float) -> None:
        """The environment answered episode `ep` after model turn `turn` at time `t`."""
        last = turn == len(self.episodes[ep].turns) - 1
        if last:
            self.finish[ep] = t
        if self.rule == "hold":  # back to its own slot (the last answer frees it)
            i = self.where[ep]
            self.catch_up(i, t)
            self.inst[i].held -= 1
            if not last:
                self.inst[i].queue.appendleft((ep, turn + 1))
        elif last:
            return
        else:
            i = min(range(len(self.inst)), key=lambda j: (self.inst[j].load, j))
            self.inst[i].queue.append((ep, turn + 1))
            if self.inst[i].free <= 0:
                return  # it waits for a slot: the instance's next finish admits it
            self.catch_up(i, t)
        self.admit(i)

    def catch_up(self, i: int, t: float) -> None:
        """Bring instance `i` to the first decode step boundary at or after `t` (or to `t` if idle)."""
        inst = self.inst[i]
        if not inst.batch.live:
            inst.t = max(inst.t, t)
        elif inst.t < t:
            live = inst.batch.live
            seconds, done = inst.batch.advance(t - inst.t)
            self.ran(i, seconds, done, live)


def episode_times(cost: CostModel, episodes: Sequence[EpisodeWork], queues: Sequence[Sequence[int]],
                  batch_caps: Sequence[int], start: float | Sequence[float] = 0.0,
                  rule: str = "refill") -> EpisodeTimes:
    """Run `episodes` on `len(queues)` rollout instances under slot `rule`.

    `queues[i]`: the episodes whose first turn instance i runs, in its FIFO order (the dispatch
    plan); `batch_caps[i]`: its slots; `start`: when the instances begin (one time, or one each:
    a joined instance once its weights arrived). Later turns go where `rule` says."""
    if rule not in SLOT_RULES:
        raise ConfigError("episode slots", rule, f"allowed: {', '.join(SLOT_RULES)}")
    if len(batch_caps) != len(queues):
        raise ConfigError("batch_caps", list(batch_caps), f"give one cap per instance ({len(queues)})")
    starts = [float(start)] * len(queues) if isinstance(start, (int, float)) else list(start)
    return _Schedule(cost, episodes, batch_caps, rule, starts).run(queues)


def deal_longest_first(episodes: Sequence[EpisodeWork], instances: int) -> list[list[int]]:
    """A balanced dispatch of whole episodes: by model tokens, longest first, round-robin."""
    order = sorted(range(len(episodes)), key=lambda e: (-episodes[e].model_tokens, e))
    return [order[i::instances] for i in range(instances)]


__all__ = ["EpisodeWork", "EpisodeTimes", "SlotRule", "SLOT_RULES", "episode_times", "deal_longest_first"]
