"""A step's episodes: hands out model turns, calls the environment, hands out the next turns.

    runner = EpisodeRunner(env_cfg, sandbox, codec, max_new_tokens, context, seed)
    runner.start(step, problems, prompt_ids, group_size)   # resets, in the sandbox
    while runner.active:
        requests, finished = runner.poll(wait_s)            # next turns; episodes that ended
        ... generate `requests` anywhere; runner.turns_done(turn_samples) as each turn finishes

A turn that finishes goes to the environment at once, while other episodes decode: the engine's
slot is free for them meanwhile, and the next turn re-fills its prefix (the whole episode so far,
one prefill), so an episode never holds a slot while its environment works. The rule for the KV
cache is therefore "re-fill", and it is what keeps a turn's tokens a function of the episode alone
whatever device runs it (docs/episodes.md measures its cost).

Environment calls run in the reward sandbox (`SandboxPool`): a call that fails (raises, hangs past
reward.timeout_s, returns something malformed or too long) ends its episode, counted in
`env_failures`; the run goes on. Each call replays the episode's actions on a fresh environment
(rewards/worker.py `_env_answer`), so no state lives between calls.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from poise.config import EnvConfig
from poise.data.tasks import Problem, derive_seed
from poise.episodes.episode import Episode
from poise.rewards.sandbox import Call, Outcome
from poise.types import Request, Sample, SampleId


class PendingCalls(Protocol):
    def done(self, wait_s: float = 0.0) -> bool: ...

    def result(self) -> list[Outcome]: ...


class EnvSandbox(Protocol):
    """What the runner needs of the sandbox: queue calls of the environment (`env_index`)."""

    env_index: int

    def submit_env(self, calls: Sequence[Call]) -> PendingCalls: ...


class TurnCodec(Protocol):
    """Text of a model turn, and the tokens of an observation (poise.episodes.codec)."""

    def action_text(self, token_ids: Sequence[int]) -> str: ...

    def observation_ids(self, observation: str) -> list[int]: ...


@dataclass(frozen=True)
class EpisodeStats:
    """What one episode did, for metrics and events."""

    turns: int
    model_tokens: int
    observation_tokens: int
    env_reward: float
    end: str
    failure: str | None
    env_calls: int
    tool_calls: int
    tool_errors: int


class EpisodeRunner:
    def __init__(self, cfg: EnvConfig, sandbox: EnvSandbox, codec: TurnCodec, max_new_tokens: int, context: int,
                 seed: int, clock: Callable[[], float] = time.perf_counter):
        self.cfg, self.sandbox, self.codec = cfg, sandbox, codec
        self.max_new_tokens, self.context, self.seed, self.clock = max_new_tokens, context, seed, clock
        self.episodes: dict[SampleId, Episode] = {}
        self._rows: dict[SampleId, tuple[str, dict]] = {}  # the problem's prompt and row, per episode
        # (each call's episode and turn, the calls, when submitted)
        self._pending: list[tuple[list[tuple[SampleId, int]], PendingCalls, float]] = []
        self._ready: list[Request] = []
        self._over: list[Sample] = []
        self.stats: dict[SampleId, EpisodeStats] = {}
        self.env_seconds = 0.0  # summed over calls, from submit to when a poll saw the answer
        self.refill_tokens = 0  # tokens of history re-filled by the turns after the first (the KV rule)
        # per rollout device: turns it generated, and the seconds from each of those turns' end to
        # its episode's next turn (or end) being handed out: the environment's wait, device by device
        self.turns_by_device: dict[int, int] = {}
        self.wait_by_device: dict[int, float] = {}
        self._turn_end: dict[SampleId, tuple[int, float]] = {}
        self.version = 0  # the weights version of the step's episodes (a stand-in for one that never ran)

    # ---- the caller's side -------------------------------------------------------------------
    def start(self, step: int, problems: Sequence[Problem], prompt_ids: Sequence[Sequence[int]],
              group_size: int, version: int) -> None:
        """Episodes (step, i, j) for each problem i and j < group_size, made with weights `version`;
        their environments reset at once (in the sandbox): `poll` hands out their first turns."""
        self.version = version
        # a step started again (a recovery): its episodes start over, none handed out twice
        for sid in [sid for sid in self.episodes if sid[0] == step]:
            del self.episodes[sid], self._rows[sid]
        self._ready = [r for r in self._ready if r.sample_id[0] != step]
        self._over = [s for s in self._over if s.sample_id[0] != step]
        for sid in [sid for sid in self.stats if sid[0] == step]:
            del self.stats[sid]
        ids = []
        for i, (problem, prompt) in enumerate(zip(problems, prompt_ids)):
            row = {**problem.columns, "prompt": problem.prompt, "answer": problem.answer}
            room = self.context - len(prompt)
            for j in range(group_size):
                sid = (step, i, j)
                self.episodes[sid] = Episode(sid, tuple(prompt), min(self.cfg.max_tokens or room, room))
                self._rows[sid] = (problem.prompt, row)
                ids.append(sid)
        self._call(ids)

    def first_turns(self, step: int, problems: Sequence[Problem], prompt_ids: Sequence[Sequence[int]],
                    group_size: int, version: int) -> dict[SampleId, Request]:
        """`start`, then wait for the resets: each episode's first turn by sample id (one that ended at
        its reset comes out of a later `poll`). Every call ends within reward.timeout_s."""
        self.start(step, problems, prompt_ids, group_size, version)
        want = sum(1 for sid in self.episodes if sid[0] == step)
        turns: dict[SampleId, Request] = {}
        ended: list[Sample] = []
        while len(turns) + len(ended) < want:
            requests, finished = self.poll(wait_s=0.05)
            turns.update((tuple(r.sample_id), r) for r in requests)
            ended += finished
        self._over = ended + self._over
        return turns

    def turns_done(self, samples: Sequence[Sample], devices: Sequence[int] | None = None) -> None:
        """Finished model turns (generated on `devices`, one each; default device 0): each goes to its
        environment (or ends its episode on the budget)."""
        ids = []
        now = self.clock()
        for k, sample in enumerate(samples):
            device = devices[k] if devices is not None else 0
            self.turns_by_device[device] = self.turns_by_device.get(device, 0) + 1
            self._turn_end[tuple(sample.sample_id)] = (device, now)
            episode = self.episodes[tuple(sample.sample_id)]
            # a turn that used up the budget still goes to the environment: it may reward the turn
            episode.add_turn(sample, self.codec.action_text(sample.token_ids))
            ids.append(episode.sample_id)
        self._call(ids)

    def poll(self, wait_s: float = 0.0) -> tuple[list[Request], list[Sample]]:
        """The turns ready to generate and the episodes that ended since the last poll; waits up to
        `wait_s` for an environment answer when none is in yet."""
        if not self._ready and not self._over and self._pending and wait_s > 0:
            deadline = self.clock() + wait_s
            while not any(p.done() for _, p, _ in self._pending) and self.clock() < deadline:
                self._pending[0][1].done(wait_s=min(0.01, max(0.0, deadline - self.clock())))
        still = []
        for ids, pending, submitted in self._pending:
            if pending.done():
                self.env_seconds += (self.clock() - submitted) * len(ids)
                self._answered(ids, pending.result())
            else:
                still.append((ids, pending, submitted))
        self._pending = still
        requests, finished = self._ready, self._over
        self._ready, self._over = [], []
        return sorted(requests, key=lambda r: r.sample_id), sorted(finished, key=lambda s: s.sample_id)

    @property
    def active(self) -> int:
        """Episodes not yet handed out as finished."""
        return len(self.episodes)

    # ---- the environment -----------------------------------------------------------------------
    def _call(self, ids: list[SampleId]) -> None:
        if not ids:
            return
        calls = []
        for sid in ids:
            prompt, row = self._rows[sid]
            history = json.dumps({"seed": derive_seed(self.seed, "env", sid), "actions": self.episodes[sid].actions})
            calls.append(Call(self.sandbox.env_index, prompt, history, row))
        self._pending.append(([(sid, self.episodes[sid].turn) for sid in ids], self.sandbox.submit_env(calls),
                              self.clock()))

    def _answered(self, ids: list[tuple[SampleId, int]], outcomes: list[Outcome]) -> None:
        for (sid, turn), outcome in zip(ids, outcomes):
            episode = self.episodes.get(sid)
            if episode is None or episode.env_calls != turn or episode.turn != turn:
                continue  # an answer for an episode whose step started again meanwhile (a recovery)
            episode.env_calls += 1
            if outcome.value is None or outcome.env is None:
                episode.end, episode.failure = "env_failure", outcome.error or "failed"
            else:
                observation, done, info = outcome.env
                episode.env_reward += outcome.value
                episode.tool_calls += int(info.get("tool_calls", 0))
                episode.tool_errors += int(info.get("tool_errors", 0))
                if not episode.actions:  # reset: the first observation joins the prompt
                    if observation:
                        episode.prompt_ids = episode.prompt_ids + tuple(self.codec.observation_ids(observation))
                        episode.budget = min(episode.budget, self.context - len(episode.prompt_ids))
                elif done:
                    episode.end = episode.end or "done"
                elif episode.turn >= self.cfg.max_turns:
                    episode.end = episode.end or "max_turns"
                elif not episode.over:
                    episode.add_observation(self.codec.observation_ids(observation))
            self._waited(sid)
            if episode.over:
                self._finish(episode)
            elif len(episode.prompt_ids) >= self.context - 1:
                episode.end, episode.failure = "max_tokens", None
                self._finish(episode)
            else:
                request = episode.request(self.max_new_tokens)
                if episode.turn:
                    self.refill_tokens += len(request.prompt_ids)
                self._ready.append(request)

    def _waited(self, sid: SampleId) -> None:
        if sid in self._turn_end:
            device, since = self._turn_end.pop(sid)
            self.wait_by_device[device] = self.wait_by_device.get(device, 0.0) + self.clock() - since

    def take_step_counters(self) -> dict[str, object]:
        """The environment's time, the re-filled tokens and the per-device turns and waits since the
        last call (a step's), reset to zero."""
        out = {"episode/env_s": self.env_seconds, "episode/refill_tokens": self.refill_tokens,
               "episode/turns_by_device": {str(d): n for d, n in sorted(self.turns_by_device.items())},
               "episode/env_wait_s_by_device": {str(d): s for d, s in sorted(self.wait_by_device.items())}}
        self.env_seconds, self.refill_tokens = 0.0, 0
        self.turns_by_device, self.wait_by_device = {}, {}
        return out

    def _finish(self, episode: Episode) -> None:
        del self.episodes[episode.sample_id]
        del self._rows[episode.sample_id]
        model = sum(episode.mask)
        self.stats[episode.sample_id] = EpisodeStats(episode.turn, model, len(episode.mask) - model,
                                                     episode.env_reward, episode.end, episode.failure,
                                                     episode.env_calls, episode.tool_calls, episode.tool_errors)
        if episode.turn:
            self._over.append(episode.sample())
        else:  # its reset failed before any turn: one masked-out stand-in token keeps the step whole
            self._over.append(_empty_episode(episode, self.version))


def _empty_episode(episode: Episode, version: int) -> Sample:
    """An episode whose environment failed at reset: no model turn. The step still needs the sample
    id (invariant 5); it trains nothing (its one token is masked out) and scores the fallback."""
    return Sample(episode.sample_id, episode.prompt_ids, (0,), (0.0,), "abort", version, 0.0, 0.0, 1, turn=0,
                  loss_mask=(0,))


__all__ = ["EpisodeRunner", "EpisodeStats", "EnvSandbox", "TurnCodec"]
