"""Dynamic sampling (DAPO, Yu et al. 2025, §3.2): a prompt group whose rewards are all equal has
no advantage to learn from, so it is dropped and another prompt is drawn in its place, until the
step has `prompts` groups that teach something.

Pure bookkeeping, shared by the colocated loop and the runtime's driver. Draw d of step k is the
prompt group generated under sample ids (k, d, j); draws 0 .. prompts - 1 are the step's ordinary
prompts and every later draw is a pure function of (seed, k, d) (data/prompts.py `TaskSteps.draws`).
A dropped group launches one more draw at once (streaming: generation never waits for the step's
other groups), so the draws launched are always a prefix 0 .. L - 1, and L ends one past the
`prompts`-th kept draw: a function of the rewards alone, never of the order groups finish in.

The trained batch is the step's ordinary plan (policy/plan.py): slot i of the step holds the i-th
kept draw in draw order, relabelled (k, i, j), so micro-batches, owners and normalisers are those
of a step without dynamic sampling. Where `max_draws` runs out first, the slots left are filled
with the earliest dropped draws (their advantages are zero under every estimator, so they only
dilute the step's normaliser); `unfilled` counts them.

    resolver = DrawResolver(prompts=32, group_size=8, max_draws=128)
    resolver.scored(sample_id, reward)   -> draws to launch now (a dropped group's replacement)
    resolver.assign()                    -> newly fixed (slot, draw) pairs, in slot order
    resolver.done                        -> every slot is fixed
"""

from __future__ import annotations

from dataclasses import dataclass, field

SampleId = tuple[int, int, int]


def group_is_informative(rewards: list[float]) -> bool:
    """A group teaches something when its rewards are not all equal (exactly: any tolerance would
    be a knob that changes which prompts train)."""
    return any(r != rewards[0] for r in rewards)


@dataclass
class DrawResolver:
    prompts: int  # slots of the step (algorithm.prompts_per_step)
    group_size: int
    max_draws: int  # draws the step may launch at most, kept and dropped
    launched: int = 0
    kept: dict[int, bool] = field(default_factory=dict)  # draw -> informative, once its group is scored
    slots: list[int] = field(default_factory=list)  # slot i -> draw
    _rewards: dict[int, dict[int, float]] = field(default_factory=dict)  # draw -> sample index -> reward
    _next: int = 0  # the first draw not yet resolved into a slot or skipped

    def __post_init__(self) -> None:
        if self.max_draws < self.prompts:
            raise ValueError(f"max_draws ({self.max_draws}) must be >= prompts ({self.prompts})")

    def start(self) -> list[int]:
        """The step's ordinary draws, 0 .. prompts - 1, launched at once."""
        self.launched = self.prompts
        return list(range(self.prompts))

    def scored(self, sample_id: SampleId, reward: float) -> list[int]:
        """Record one sample's reward; returns the draws to launch now (a dropped group's
        replacement, while the step may still draw)."""
        draw, index = sample_id[1], sample_id[2]
        if draw >= self.launched:
            raise ValueError(f"sample {sample_id} belongs to draw {draw}, but only {self.launched} were launched")
        group = self._rewards.setdefault(draw, {})
        if index in group:
            raise ValueError(f"sample {sample_id} scored twice")
        group[index] = reward
        if len(group) < self.group_size:
            return []
        self.kept[draw] = group_is_informative([group[j] for j in range(self.group_size)])
        if self.kept[draw] or self.launched >= self.max_draws:
            return []
        self.launched += 1
        return [self.launched - 1]

    def assign(self) -> list[tuple[int, int]]:
        """Slots fixed since the last call: (slot, draw), in slot order. Slot i is fixed once every
        draw before its draw is resolved, so the assignment never depends on arrival order."""
        new = []
        while len(self.slots) < self.prompts and self._next < self.launched and self._next in self.kept:
            if self.kept[self._next]:
                self.slots.append(self._next)
                new.append((len(self.slots) - 1, self._next))
            self._next += 1
        if (len(self.slots) < self.prompts and self._next == self.launched == self.max_draws):
            # every draw is resolved and none may follow: the earliest dropped draws fill the rest
            for draw in sorted(d for d, keep in self.kept.items() if not keep):
                if len(self.slots) == self.prompts:
                    break
                self.slots.append(draw)
                new.append((len(self.slots) - 1, draw))
        return new

    @property
    def done(self) -> bool:
        return len(self.slots) == self.prompts

    @property
    def dropped(self) -> int:
        """Draws whose group was dropped (all rewards equal)."""
        return sum(1 for keep in self.kept.values() if not keep)

    @property
    def unfilled(self) -> int:
        """Slots holding a dropped draw because max_draws ran out."""
        return sum(1 for d in self.slots if not self.kept[d])

    def metrics(self) -> dict[str, float]:
        return {"dynamic/dropped_groups": self.dropped, "dynamic/draws": self.launched,
                "dynamic/extra_samples": (self.launched - self.prompts) * self.group_size,
                "dynamic/unfilled": self.unfilled}


def default_max_draws(prompts: int, max_prompt_draws: int) -> int:
    """algorithm.max_prompt_draws, where 0 means 4 x prompts_per_step."""
    return max_prompt_draws or 4 * prompts


__all__ = ["DrawResolver", "group_is_informative", "default_max_draws"]
