"""Outcome advantages (GRPO, Dr. GRPO, RLOO, REINFORCE++), in plain Python floats (no torch).

The colocated loop and the runtime's trainer group both call this (`ready_advantages`), one group at a time, so a
sample's advantage is a function of its group's rewards alone: not of how many other groups were
computed beside it, nor of the machine's vector width. (A torch reduction over a [prompts, G]
table need not give a row the bits it gets in a [1, G] table: on an AVX-512 machine the mean of a
row differed in the last bit, and the colocated loop and the runtime trained apart.) `math.fsum`
rounds once, so the result does not depend on the order the rewards are listed in either.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

SampleId = tuple[int, int, int]  # (step, prompt_index, sample_index)


STD_EPS = 1e-6  # algorithm.std_eps's default (TRL adds 1e-4)


def group_advantages(rewards: Sequence[float], scale: bool = True, eps: float = STD_EPS) -> list[float]:
    """(r - mean) / (std + eps) for each reward of one group, with the unbiased std (DeepSeekMath
    §4.1.2), or only centred when `scale` is False (Dr. GRPO). Equal rewards give 0 each."""
    n = len(rewards)
    if n < 2:
        raise ValueError(f"a prompt group needs group_size >= 2 rewards to normalise, got {n}")
    mean = math.fsum(rewards) / n
    centred = [r - mean for r in rewards]
    if not scale:
        return centred
    std = math.sqrt(math.fsum(c * c for c in centred) / (n - 1))
    return [c / (std + eps) for c in centred]


ADVANTAGES = ("grpo", "grpo_batch", "dr_grpo", "rloo", "reinforce_pp")  # algorithm.advantage
# Estimators that scale by the whole step's batch: a step's advantages exist only once every
# reward of the step is in, so the trainer starts no micro-batch before then (no streaming overlap).
STEP_SCOPED = frozenset({"grpo_batch", "reinforce_pp"})


def batch_scaled_advantages(groups: Sequence[Sequence[float]], eps: float = STD_EPS) -> list[list[float]]:
    """Each reward minus its group's mean, divided by the std (unbiased) of every reward of the
    batch (every group given): TRL's `scale_rewards="batch"` (its `_generate_and_score_completions`;
    Hu et al. 2025 argue a batch std is the more robust scale). The rewards themselves are scaled,
    not the centred values (REINFORCE++'s choice): a batch whose groups sit at different levels has
    a larger std here."""
    centred = _group_centred(groups)
    _, std = _mean_and_std([r for rewards in groups for r in rewards])
    return [[c / (std + eps) for c in group] for group in centred]


def _group_centred(groups: Sequence[Sequence[float]]) -> list[list[float]]:
    """Each reward minus its group's mean (a group needs >= 2 rewards)."""
    centred = []
    for rewards in groups:
        if len(rewards) < 2:
            raise ValueError(f"a prompt group needs group_size >= 2 rewards, got {len(rewards)}")
        mean = math.fsum(rewards) / len(rewards)
        centred.append([r - mean for r in rewards])
    return centred


def _mean_and_std(values: Sequence[float]) -> tuple[float, float]:
    """The mean and the unbiased std of `values` (exactly summed: math.fsum)."""
    mean = math.fsum(values) / len(values)
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def rloo_advantages(rewards: Sequence[float]) -> list[float]:
    """REINFORCE Leave-One-Out (Kool et al. 2019; Ahmadian et al. 2024, eq. 5): each reward minus
    the mean of the *other* rewards of its group, r_i - (sum_j r_j - r_i) / (G - 1)."""
    n = len(rewards)
    if n < 2:
        raise ValueError(f"a prompt group needs group_size >= 2 rewards for a leave-one-out baseline, got {n}")
    total = math.fsum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


def reinforce_pp_advantages(groups: Sequence[Sequence[float]], eps: float = STD_EPS) -> list[list[float]]:
    """REINFORCE++ with the group-mean baseline (Hu et al. 2025, §3; verl's
    `reinforce_plus_plus_baseline`): each reward minus its group's mean, then the centred values of
    the whole batch (every group given) divided by their std (unbiased) after subtracting their
    mean. Outcome rewards only: no per-token KL in the reward (Poise's KL is a loss term)."""
    centred = _group_centred(groups)
    mean, std = _mean_and_std([c for group in centred for c in group])
    return [[(c - mean) / (std + eps) for c in group] for group in centred]


def outcome_advantages(estimator: str, groups: Sequence[Sequence[float]], eps: float = STD_EPS) -> list[list[float]]:
    """The advantages of `groups` (each one prompt's rewards, in sample order) by `estimator`:
    grpo (centred, divided by the group's std), grpo_batch (centred, divided by the batch's std:
    pass the step's every group), dr_grpo (centred only; Liu et al. 2025, Dr. GRPO), rloo
    (leave-one-out baseline) or reinforce_pp (group baseline, batch std: pass the step's every
    group). `eps` is added to each std. Group estimators compute each group on its own (see the
    module docstring)."""
    if estimator == "reinforce_pp":
        return reinforce_pp_advantages(groups, eps)
    if estimator == "grpo_batch":
        return batch_scaled_advantages(groups, eps)
    if estimator in ("grpo", "dr_grpo"):
        return [group_advantages(g, scale=estimator == "grpo", eps=eps) for g in groups]
    if estimator == "rloo":
        return [rloo_advantages(g) for g in groups]
    raise ValueError(f"unknown advantage estimator {estimator!r}; allowed: {', '.join(ADVANTAGES)}")


def ready_advantages(estimator: str, rewards: Mapping[SampleId, float], sid: SampleId, group_size: int,
                     prompts: int, eps: float = STD_EPS) -> dict[SampleId, float]:
    """The advantages that the arrival of `sid`'s reward completes (empty if none): its prompt
    group's once the group's rewards are all in, or, for a step-scoped estimator, the step's
    once all its `prompts` x `group_size` rewards are. `rewards`: every reward of the step so far.

    The colocated loop and the trainer group both call this, so the values are the same whichever
    order the samples arrived in."""
    step, prompt = sid[0], sid[1]
    if estimator in STEP_SCOPED:
        ids = [[(step, i, j) for j in range(group_size)] for i in range(prompts)]
    else:
        ids = [[(step, prompt, j) for j in range(group_size)]]
    if not all(g in rewards for group in ids for g in group):
        return {}
    values = outcome_advantages(estimator, [[rewards[g] for g in group] for group in ids], eps)
    return {g: a for group, adv in zip(ids, values) for g, a in zip(group, adv)}
