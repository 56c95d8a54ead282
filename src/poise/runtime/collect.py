"""Each step's samples, scored as they arrive and handed on (docs/design.md "Stream generation
service"): every arrived batch goes to the reward sandbox at once, and each scored sample to the
trainer (streaming) or, in async, ahead into the object store. Three ways to collect a step:
single-turn samples, multi-turn episodes (each finished turn goes to its environment), and
dynamic sampling (a group whose rewards are all equal is dropped and drawn again)."""

from __future__ import annotations

import dataclasses

from poise.algo.shaping import overlong_penalty
from poise.config import AlgorithmConfig
from poise.data.tasks import Problem
from poise.episodes.metrics import with_env_rewards
from poise.episodes.runner import EpisodeRunner
from poise.policy.dynamic import DrawResolver, default_max_draws
from poise.rewards.scorer import PendingRewards, RewardResult
from poise.runtime.runtime import Runtime, StepSource
from poise.types import Sample, SampleId, trained_tokens

SCORE_WAIT_S = 0.02  # how long the driver waits for a just-arrived batch's rewards before taking the next batch


@dataclasses.dataclass
class DynamicStep:
    """Dynamic sampling's outcome for one step: slot i holds draw `slots[i]` (policy/dynamic.py),
    whose problem is `problems[i]`; `metrics` go into the step's row. Partial rollouts
    (runtime/partial.py) use it too: slot i holds the group [origin step, prompt index]."""

    slots: list
    problems: list[Problem]
    metrics: dict[str, float]


class Collector:
    """Collects the samples of a step in generation on the runtime `rt` (its service and trainer are
    read at each call: a restart replaces them). Keeps what the step's log reads until it is
    logged: each sample's reward per function, dynamic sampling's slots, the episodes' counters."""

    def __init__(self, rt: Runtime, source: StepSource, algorithm: AlgorithmConfig, kind: str,
                 injector, episodes: EpisodeRunner | None):
        self.rt, self.source, self.algorithm, self.kind = rt, source, algorithm, kind
        self.injector, self.episodes = injector, episodes  # injected faults (none by default); env.name: episodes
        self.reward_results: dict[SampleId, RewardResult] = {}  # per function, until the step is logged
        self.dynamic: dict[int, DynamicStep] = {}  # dynamic sampling: each generated step's slots, until logged
        self.episode_counters: dict[int, dict] = {}  # per generated step, until logged

    def collect(self, problems: list[Problem], stream_to_trainer: bool = False, step: int = -1
                ) -> list[tuple[Sample, float]]:
        """Score every sample of the step in generation as its batch arrives (and train on it).
        Each arrived batch goes to the reward sandbox at once; batches are taken back in arrival
        order as they are scored (a fast reward within SCORE_WAIT_S), so slow rewards overlap the
        generation and arrival of the next batches."""
        if self.algorithm.dynamic_sampling:
            return self.collect_dynamic(problems, stream_to_trainer, step)
        if self.episodes is not None:
            return self.collect_episodes(problems, stream_to_trainer, step)
        scored: list[tuple[Sample, float]] = []
        pending: list[tuple[list[Sample], PendingRewards]] = []
        for batch in self.rt.service.stream():
            self.injector.at(self.rt, "generate", step)  # an injected death: samples are in flight now
            pending.append((batch, self.source.submit_scores(problems, batch)))
            pending[-1][1].done(wait_s=SCORE_WAIT_S)
            while pending and pending[0][1].done():
                scored += self.take_scored(*pending.pop(0), stream_to_trainer)
        for batch, rewards in pending:
            scored += self.take_scored(batch, rewards, stream_to_trainer)
        self.rt.service.observe([s for s, _ in scored])
        return scored

    def collect_episodes(self, problems: list[Problem], stream_to_trainer: bool, step: int
                         ) -> list[tuple[Sample, float]]:
        """`collect` for multi-turn episodes: each finished turn goes to its environment at once (in
        the reward sandbox) while the rollout devices decode other turns; an environment's answer
        hands the next turn to a rollout instance (`submit_turns`); an episode that ends is scored (the reward
        functions on its last turn plus its environment's rewards) and goes on (to the trainer)."""
        runner, scored = self.episodes, []
        pending: list[tuple[list[Sample], PendingRewards]] = []

        def hand_out(wait_s: float) -> None:
            requests, finished = runner.poll(wait_s)
            if requests:
                self.rt.service.submit_turns(requests)
            if finished:
                pending.append((finished, self.source.submit_scores(problems, finished)))
            while pending and pending[0][1].done():
                scored.extend(self.take_episodes(*pending.pop(0), stream_to_trainer))

        while runner.active:
            for batch in self.rt.service.stream(heartbeat=True):
                if batch:
                    self.injector.at(self.rt, "generate", step)
                    runner.turns_done(batch, [self.rt.service.instance_of[s.sample_id] for s in batch])
                hand_out(0.0)
            if runner.active:  # nothing generating: every live episode waits for its environment
                hand_out(SCORE_WAIT_S)
        for batch, rewards in pending:
            scored += self.take_episodes(batch, rewards, stream_to_trainer)
        self.rt.service.observe([s for s, _ in scored])
        self.episode_counters[step] = runner.take_step_counters()  # this generation's (in async: step k+1's)
        return scored

    def take_episodes(self, batch: list[Sample], rewards: PendingRewards, stream_to_trainer: bool
                      ) -> list[tuple[Sample, float]]:
        results = with_env_rewards(dict(zip((s.sample_id for s in batch), rewards.result())), self.episodes.stats)
        self.reward_results.update(results)
        part = [(s, self.shaped(s, results[s.sample_id].value)) for s in batch]
        self.hand_on(part, stream_to_trainer)
        return part

    def collect_dynamic(self, problems: list[Problem], stream_to_trainer: bool, step: int
                        ) -> list[tuple[Sample, float]]:
        """`collect` with dynamic sampling (policy/dynamic.py): a group whose rewards are all equal
        is dropped once scored and a new draw goes to the instances at once; each slot's group,
        relabelled (step, slot, j), goes on (to the trainer) once every draw before it is resolved."""
        a = self.algorithm
        resolver = DrawResolver(a.prompts_per_step, a.group_size, default_max_draws(a.prompts_per_step,
                                                                                     a.max_prompt_draws))
        resolver.start()  # the step's own prompts: dispatched by start_generation
        by_draw: dict[int, Problem] = dict(enumerate(problems))
        drawn: dict[SampleId, tuple[Sample, RewardResult, float]] = {}
        scored: list[tuple[Sample, float]] = []

        def take(batch: list[Sample], rewards: PendingRewards) -> None:
            launch: list[int] = []
            for s, r in zip(batch, rewards.result()):
                value = self.shaped(s, r.value)
                drawn[s.sample_id] = (s, r, value)
                launch += resolver.scored(s.sample_id, value)
            if launch:  # the dropped groups' replacements start now, whatever else is in flight
                new = self.source.draws(step, launch)
                by_draw.update(zip(launch, new))
                self.rt.service.extend(step, new, [self.source.prompt_ids(p) for p in new], launch)
            part = []
            for slot, draw in resolver.assign():
                for j in range(a.group_size):
                    s, r, value = drawn[(step, draw, j)]
                    sample = dataclasses.replace(s, sample_id=(step, slot, j))
                    self.rt.service.instance_of[sample.sample_id] = self.rt.service.instance_of[s.sample_id]
                    self.reward_results[sample.sample_id] = r
                    part.append((sample, value))
            self.hand_on(part, stream_to_trainer)
            scored.extend(part)

        while not resolver.done:
            pending: list[tuple[list[Sample], PendingRewards]] = []
            for batch in self.rt.service.stream():
                self.injector.at(self.rt, "generate", step)
                pending.append((batch, self.source.submit_scores(by_draw, batch)))
                pending[-1][1].done(wait_s=SCORE_WAIT_S)
                while pending and pending[0][1].done():
                    take(*pending.pop(0))
            launched = resolver.launched
            for batch, rewards in pending:
                take(batch, rewards)
            if not resolver.done and resolver.launched == launched:
                raise RuntimeError(f"step {step}: dynamic sampling stalled with {len(resolver.slots)} of "
                                   f"{a.prompts_per_step} slots fixed and nothing in flight")
        self.rt.service.observe([s for s, _, _ in drawn.values()])
        generated = [value for _, _, value in drawn.values()]
        self.dynamic[step] = DynamicStep(list(resolver.slots), [by_draw[d] for d in resolver.slots],
                                         {**resolver.metrics(),
                                          "dynamic/reward_mean_generated": sum(generated) / len(generated)})
        return scored

    def shaped(self, sample: Sample, reward: float) -> float:
        """The reward the algorithm sees: the reward functions' plus overlong shaping (algo/shaping.py)."""
        a = self.algorithm
        return reward + overlong_penalty(trained_tokens(sample), a.sampling.max_new_tokens, a.overlong_buffer,
                                         a.overlong_penalty)

    def take_scored(self, batch: list[Sample], rewards: PendingRewards, stream_to_trainer: bool
                    ) -> list[tuple[Sample, float]]:
        results = rewards.result()
        self.reward_results.update((s.sample_id, r) for s, r in zip(batch, results))
        part = [(s, self.shaped(s, r.value)) for s, r in zip(batch, results)]
        self.hand_on(part, stream_to_trainer)
        return part

    def hand_on(self, part: list[tuple[Sample, float]], stream_to_trainer: bool) -> None:
        """Scored samples go to the trainer (streaming), or, in async, ahead into the object store."""
        if stream_to_trainer:
            self.rt.trainer.feed(part)
        elif self.kind == "async":
            self.rt.trainer.arrive_ahead([s for s, _ in part])
