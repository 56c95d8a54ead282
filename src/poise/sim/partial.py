"""Partial rollouts and over-provisioning on the virtual clock (`pipeline.partial_tokens`,
`pipeline.max_staleness`, `pipeline.overprovision`), with the semantics the runtime follows.

One generation phase per trained step; in async the phase of step k runs with weights version
v = k-1 while step k-1 trains (policy.pipeline.weights_version). The driver holds a pool of
prompt groups between phases; nothing stays on an instance.

    top up   new groups of step k start so that the pool holds prompts_per_step + overprovision
             groups: prompt indices 0.. from step k's problems, indices >= prompts_per_step
             drawn like dynamic sampling's extra draws (workload.extra_groups).
    window   every unfinished sample decodes at most `partial_tokens` more tokens and leaves its
             slot at that cap, except one whose first token came from a version <= v -
             (max_staleness - 1): it runs to its end now, so no trained token lags the weights it
             trains against by more than max_staleness. A sample re-enters with its prefix
             re-prefilled (prompt + tokens so far: its KV cache is rebuilt, under the new weights
             when the version moved). The driver's `generate` prices a window: dispatch by prompt
             group, then continuous batching on each instance.
    repeat   while fewer than prompts_per_step groups are complete, another window at version v.
    batch    the first prompts_per_step complete groups by (origin step, prompt index); slot i
             is relabelled (k, i, j) for the step plan, as dynamic sampling's slots are. The rest
             wait in the pool for the next phase.

With max_staleness 1 every sample runs to its end in its first window, the pool empties every
step and a phase is exactly the one-step-off async generation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Protocol

from poise.config.policy import PipelineConfig
from poise.sim.workload import SimSample

# The driver's `generate(k, samples, start)`: (finish time, instance, admission time) per sample.
Generate = Callable[[int, list[SimSample], float], tuple[list[float], list[int], list[float]]]


class GroupSource(Protocol):
    def step(self, k: int) -> list[SimSample]: ...

    def extra_groups(self, k: int, indices: list[int]) -> list[SimSample]: ...


@dataclass
class Rollout:
    """One sample in the pool: its origin id and whole length, and how far it got."""

    sample: SimSample
    done: int = 0  # tokens generated so far
    versions: list[tuple[int, int]] = field(default_factory=list)  # (weights version, tokens), in token order
    finished_at: float = 0.0
    instance: int = 0

    @property
    def complete(self) -> bool:
        return self.done >= self.sample.output_length


@dataclass
class Group:
    origin: int  # the step whose problem it is
    index: int  # prompt index (>= prompts_per_step: over-provisioned)
    members: list[Rollout]

    @property
    def complete(self) -> bool:
        return all(r.complete for r in self.members)


@dataclass(frozen=True)
class Phase:
    """What a phase hands the trainer: the batch (relabelled), when and where each finished."""

    samples: list[SimSample]
    finish: list[float]
    instance: list[int]
    end: float  # the last window's end: the batch is ready
    lags: dict[int, int]  # trained tokens by version lag (trained version - token version)
    metrics: dict[str, float]
    groups: list[tuple[int, int]]  # slot i's group: (origin step, prompt index), as the runtime's `draw`


class PartialRollouts:
    """The driver's pool of groups and the phase rule above."""

    def __init__(self, pipeline: PipelineConfig, source: GroupSource, prompts_per_step: int):
        self.window = pipeline.partial_tokens
        self.staleness = pipeline.staleness
        self.overprovision = pipeline.overprovision
        self.prompts = prompts_per_step
        self.source = source
        self.pool: list[Group] = []  # sorted by (origin, index)

    def budget(self, r: Rollout, v: int) -> int:
        """Tokens `r` may decode in a window at version v."""
        rest = r.sample.output_length - r.done
        first = r.versions[0][0] if r.versions else v
        return rest if first <= v - (self.staleness - 1) else min(rest, self.window)

    def top_up(self, k: int) -> None:
        """Start step k's new groups."""
        n = self.prompts + self.overprovision - len(self.pool)
        if n <= 0:
            return
        new = [s for s in self.source.step(k) if s.sample_id[1] < min(n, self.prompts)]
        new += self.source.extra_groups(k, list(range(self.prompts, n)))
        groups: dict[int, list[Rollout]] = {}
        for s in new:
            groups.setdefault(s.sample_id[1], []).append(Rollout(s))
        self.pool += [Group(k, i, sorted(m, key=lambda r: r.sample.sample_id[2])) for i, m in sorted(groups.items())]
        self.pool.sort(key=lambda g: (g.origin, g.index))

    def run_window(self, k: int, v: int, start: float, generate: Generate) -> float:
        """One window at version v from `start` over every unfinished sample; returns its end."""
        live = [(gi, r) for gi, g in enumerate(self.pool) for r in g.members if not r.complete]
        if not live:
            return start
        budgets = [self.budget(r, v) for _, r in live]
        # a carried sample is re-admitted with its prefix: the prefill covers prompt + tokens so far
        work = [SimSample((k, gi, r.sample.sample_id[2]), r.sample.prompt, r.sample.prompt_len + r.done, b)
                for (gi, r), b in zip(live, budgets)]
        finish, instance, _ = generate(k, work, start)
        for (_, r), b, t, inst in zip(live, budgets, finish, instance):
            r.done += b
            if r.versions and r.versions[-1][0] == v:
                r.versions[-1] = (v, r.versions[-1][1] + b)
            else:
                r.versions.append((v, b))
            r.finished_at, r.instance = t, inst
        return max(finish)

    def phase(self, k: int, v: int, start: float, generate: Generate) -> Phase:
        """Step k's phase at weights version v from `start`: top up, windows, the batch."""
        self.top_up(k)
        end = self.run_window(k, v, start, generate)
        windows = 1
        while sum(g.complete for g in self.pool) < self.prompts and any(not g.complete for g in self.pool):
            end = self.run_window(k, v, end, generate)
            windows += 1
        batch = [g for g in self.pool if g.complete][: self.prompts]
        taken = {id(g) for g in batch}
        self.pool = [g for g in self.pool if id(g) not in taken]
        samples, finish, instance, lags = [], [], [], {}
        for slot, g in enumerate(batch):
            for r in g.members:
                samples.append(dataclasses.replace(r.sample, sample_id=(k, slot, r.sample.sample_id[2])))
                finish.append(r.finished_at)
                instance.append(r.instance)
                for version, n in r.versions:
                    lags[k - version] = lags.get(k - version, 0) + n
        metrics: dict[str, float] = {f"partial/staleness_{lag}": n for lag, n in sorted(lags.items())}
        # as the runtime's rows (docs/partial-rollouts.md): batch groups from an earlier step, groups left waiting
        metrics.update({"partial/carried_groups": sum(g.origin < k for g in batch),
                        "partial/overprovisioned_groups": len(self.pool),
                        "partial/windows": windows})
        return Phase(samples, finish, instance, end, lags, metrics, [(g.origin, g.index) for g in batch])


__all__ = ["PartialRollouts", "Phase", "Group", "Rollout", "Generate"]
