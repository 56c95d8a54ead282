"""The AdamW state of an owner's run (`cluster.shard: optimizer | full`): the check that an owner
steps with exactly its own state, and the owner's clip and step. Both sharded states compose it.
"""

from __future__ import annotations

import torch

from poise.training.state.placement import gather_ragged


class OwnedOptimizer:
    """`stepped`: whether the optimizer state exists (somewhere) yet: before the first update no
    owner holds any, after it every owner holds its run's, all of it."""

    def __init__(self, trainer, rank: int) -> None:
        self.trainer, self.rank = trainer, rank
        self.stepped = False

    def check(self, first: int, end: int) -> None:
        """An owner steps with the state of exactly its run (all of it once any update happened):
        AdamW would start a missing moment from zero without a word."""
        state = self.trainer.optimizer.state
        held = [i for i, p in enumerate(self.trainer.params) if p in state]
        want = list(range(first, end)) if self.stepped else []
        if held != want:
            raise RuntimeError(f"device {self.rank} holds the optimizer state of parameters {_spans(held)} but owns "
                               f"{_spans(list(range(first, end)))}{'' if self.stepped else ' (before any update)'}: "
                               "a reshard of the optimizer state is missing")

    def step_run(self, grads: list[torch.Tensor], normaliser: float, runs: list[tuple[int, int]], me: int,
                 group) -> tuple[float, int]:
        """Clip and step owner `me`'s run (the global norm from every owner's per-tensor norms, in
        parameter order); returns the norm and the bytes the norms' all-gather received."""
        counts = [b - a for a, b in runs]
        norm = self.trainer.apply_update(grads, normaliser, runs[me][0],
                                         lambda mine: gather_ragged(mine, counts, me, group))
        self.stepped = True
        return norm, 4 * max(counts) * len(runs)


def _spans(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'; '(none)' when empty."""
    out: list[str] = []
    for i in indices:
        if out and int(out[-1].split("-")[-1]) == i - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out) or "(none)"
