"""Partial rollouts with bounded staleness and active over-provisioning (`pipeline.partial_tokens`,
`max_staleness`, `overprovision`; docs/partial-rollouts.md).

In async mode the generation for step t runs while step t-1 trains, with weights v = t-1 (a
phase). Here a sample may keep generating across weight updates: the driver holds a pool of
unfinished samples (tokens, per-token versions and behaviour log-probs so far) and finished ones
not yet trained, and every phase hands all of its work back, so nothing stays on a rollout device
between phases (a resize, a crash or a checkpoint between them loses nothing).

A phase, with P = prompts_per_step, O = overprovision, S = max_staleness, W = partial_tokens:

1. New prompt groups start so that the pool holds P + O groups: sample ids (t, i, j), problem i
   of step t (i >= P: the step's extra draw i, as dynamic sampling draws them).
2. A window: every unfinished sample decodes at most W more tokens, except one whose first token
   is of a version <= v - (S - 1), which runs to its end (so no trained token lags its update's
   weights by more than S versions, and nothing is dropped).
3. While fewer than P groups are complete, another window at the same version.
4. Step t's batch: the first P complete groups by (origin step, prompt index); slot i's samples
   are relabelled (t, i, j). The rest wait for later steps.

Which window, and so which weights, makes each token is a function of (seed, sample id, token
index, the step plan) only: never of arrival order, timing or the split.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from pathlib import Path

from poise.config import AlgorithmConfig, PipelineConfig
from poise.data.tasks import Problem
from poise.errors import PoiseError
from poise.runtime.collect import Collector, DynamicStep
from poise.runtime.runtime import Runtime, StepSource
from poise.training.checkpoint import decode_samples, encode_samples
from poise.types import Sample, SampleId

PARTIAL_POOL = "partial_pool.jsonl"  # an async checkpoint's pool: unfinished and finished-untrained samples

Group = tuple[int, int]  # (origin step, prompt index)


class PartialPool:
    """The driver's pool of partial rollouts and the phases that advance it (module docstring).
    The runtime `rt` is read at each call (a restart replaces its service)."""

    def __init__(self, rt: Runtime, source: StepSource, collector: Collector, algorithm: AlgorithmConfig,
                 pipeline: PipelineConfig):
        self.rt, self.source, self.collector = rt, source, collector
        self.prompts, self.group_size = algorithm.prompts_per_step, algorithm.group_size
        self.max_new_tokens = algorithm.sampling.max_new_tokens
        self.staleness, self.window, self.extra = pipeline.staleness, pipeline.partial_tokens, pipeline.overprovision
        self.unfinished: dict[SampleId, Sample] = {}
        self.finished: dict[SampleId, Sample] = {}  # not yet in a step's batch
        self.instance: dict[SampleId, int | None] = {}  # the device that last generated each sample

    # --- the phase -------------------------------------------------------------------------------
    def phase(self, step: int, version: int) -> list[tuple[Sample, float]]:
        """Generate the batch of step `step` with the weights `version` the rollout devices hold;
        returns its samples (relabelled (step, slot, j)) with their rewards."""
        self.start_groups(step, version)
        windows = 0
        while windows == 0 or len(self.complete()) < self.prompts:
            self.run_window(step, version)
            windows += 1
        return self.take_batch(step, windows)

    def groups(self) -> set[Group]:
        return {(s.sample_id[0], s.sample_id[1]) for s in [*self.unfinished.values(), *self.finished.values()]}

    def complete(self) -> list[Group]:
        """Groups whose every sample is finished, by (origin step, prompt index)."""
        return sorted(g for g in self.groups() if all((*g, j) in self.finished for j in range(self.group_size)))

    def problem(self, origin: int, index: int) -> Problem:
        """Problem `index` of step `origin` (index >= prompts_per_step: the step's extra draw)."""
        return self.source.draws(origin, [index])[0]

    def start_groups(self, step: int, version: int) -> None:
        """Fill the pool up to prompts_per_step + overprovision groups with groups of step `step`."""
        held = len(self.groups())
        new = list(range(max(0, self.prompts + self.extra - held)))
        now = time.time()
        for index, problem in zip(new, self.source.draws(step, new) if new else []):
            prompt = tuple(self.source.prompt_ids(problem))
            for j in range(self.group_size):  # a partial with no token yet: the engine starts it
                sid = (step, index, j)
                self.unfinished[sid] = Sample(sid, prompt, (), (), "abort", version, now, now, self.max_new_tokens,
                                              token_versions=())

    def budget(self, sample: Sample, version: int) -> int | None:
        """Tokens `sample` may decode in a window at `version`; None: to its end (its first token
        would otherwise lag more than max_staleness versions behind the update that trains it)."""
        first = sample.token_versions[0] if sample.token_versions else version
        return None if first <= version - (self.staleness - 1) else self.window

    def run_window(self, step: int, version: int) -> None:
        """One window over every unfinished sample; the pool changes only once all are back, so a
        window that a dead worker broke runs again from the same state."""
        work = [self.unfinished[sid] for sid in sorted(self.unfinished)]
        budgets = {s.sample_id: b for s in work if (b := self.budget(s, version)) is not None}
        service = self.rt.service
        service.continue_partials(step, work, budgets)
        back = [s for batch in service.stream() for s in batch]
        ids = sorted(tuple(s.sample_id) for s in back)
        if ids != sorted(self.unfinished):
            raise PoiseError(f"partial rollouts, step {step}: {len(work)} samples went out and {len(ids)} came back "
                             f"({sorted(set(self.unfinished) ^ set(ids))[:5]} differ); a rollout instance lost or "
                             "doubled them")
        for s in back:
            sid = tuple(s.sample_id)
            self.instance[sid] = service.instance_of.get(sid)
            if s.finish_reason == "abort":
                self.unfinished[sid] = s
            else:
                del self.unfinished[sid]
                self.finished[sid] = s

    def take_batch(self, step: int, windows: int) -> list[tuple[Sample, float]]:
        """The first prompts_per_step complete groups, relabelled as step `step`'s slots and scored."""
        chosen = self.complete()[:self.prompts]
        samples = []
        for slot, (origin, index) in enumerate(chosen):
            for j in range(self.group_size):
                s = self.finished.pop((origin, index, j))
                samples.append(dataclasses.replace(s, sample_id=(step, slot, j)))
                self.rt.service.instance_of[(step, slot, j)] = self.instance.pop(s.sample_id, None)
        problems = [self.problem(origin, index) for origin, index in chosen]
        lags = Counter(step - v for s in samples for v in s.token_versions or ())
        metrics = {f"partial/staleness_{lag}": float(n) for lag, n in sorted(lags.items())}
        metrics.update({"partial/carried_groups": float(sum(origin < step for origin, _ in chosen)),
                        "partial/overprovisioned_groups": float(len(self.groups())),
                        "partial/windows": float(windows)})
        self.collector.dynamic[step] = DynamicStep([list(g) for g in chosen], problems, metrics)
        results = self.source.submit_scores(problems, samples).result()
        self.collector.reward_results.update((s.sample_id, r) for s, r in zip(samples, results))
        return [(s, self.collector.shaped(s, r.value)) for s, r in zip(samples, results)]

    # --- checkpoint ------------------------------------------------------------------------------
    def checkpoint_files(self) -> dict[str, bytes]:
        """The pool, for an async checkpoint's extra files (beside the next step's batch)."""
        held = sorted([*self.unfinished.values(), *self.finished.values()], key=lambda s: s.sample_id)
        return {PARTIAL_POOL: encode_samples(held, self.instance)}

    def restore(self, checkpoint: Path, slots: list[list[int]]) -> list[Problem]:
        """Load the pool a checkpoint kept; returns the problems of the resumed step's batch slots."""
        path = checkpoint / PARTIAL_POOL
        if not path.is_file():
            raise PoiseError(f"checkpoint '{checkpoint}' has no {PARTIAL_POOL} (a run without partial rollouts): "
                             "resume it with pipeline.partial_tokens=0")
        self.unfinished, self.finished, self.instance = {}, {}, {}
        for s, device in decode_samples(path):
            (self.unfinished if s.finish_reason == "abort" else self.finished)[s.sample_id] = s
            self.instance[s.sample_id] = device
        return [self.problem(origin, index) for origin, index in slots]
