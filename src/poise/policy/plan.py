"""The step plan: what one RL step trains on and how, as one pure function (docs/design.md invariants
3, 4 and 5). The colocated loop, the runtime's trainer group, the simulator and the emulated
trainer all consume it; none of them cuts batches or sums normalisers on its own.

    plan_step(step, prompts, group_size, ...) -> StepPlan
        sample_ids        the exact set of ids the step needs, sorted (invariant 5)
        weights_version   the version its samples are generated with (invariant 4)
        minis             `updates_per_step` mini-batches of whole prompt groups, in id order
          .micro          canonical micro-batches: the mini-batch cut every `micro_batch_size`
                          ids, never by arrival (invariant 3)
          .ranges         micro-batch j goes to train device d when lo_d <= j < hi_d
                          (contiguous, so each device's part is a union of reduction subtrees)

    tail_shares(pending, devices)
        with `pipeline.assist` (sync), the first mini-batch's micro-batches not started when
        generation ends, shared over the train devices and the rollout devices, idle until the
        weight sync; they hold the same weights, so they can compute gradients (not steps).

    pack_rows(lengths)
        how a micro-batch's sequences share the rows of one packed forward (first-fit
        decreasing by length, ties by sample id): no padding between short and long sequences.

    loss_normaliser(micro_lengths, loss_agg)
        the number a mini-batch's summed loss is divided by (tokens or responses: a function of
        the samples' lengths alone, never of which device holds them), summed per micro-batch
        (micro_normaliser) and then over micro-batches, in one fixed order, whoever computes it.

    step_stats(micro, grad_norms)
        a step's loss, grad_norm, clip_frac, kl, entropy and rollout/trainer mismatch
        (policy/mismatch.py) from its micro-batches' MicroStats (in index order) and each
        update's gradient norm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from poise.errors import ConfigError
from poise.policy.mismatch import MismatchStats, correction_metrics, mismatch_metrics
from poise.policy.pipeline import weights_version as _weights_version

SampleId = tuple[int, int, int]  # (step, prompt_index, sample_index)



@dataclass(frozen=True)
class MiniBatch:
    index: int
    sample_ids: tuple[SampleId, ...]  # sorted
    micro: tuple[tuple[SampleId, ...], ...]  # canonical micro-batches, in index order
    ranges: tuple[tuple[int, int], ...]  # per train device: its contiguous [lo, hi) of micro index

    def owner(self, micro_index: int) -> int:
        """The train device (position in the train group) that computes micro-batch `micro_index`."""
        for d, (lo, hi) in enumerate(self.ranges):
            if lo <= micro_index < hi:
                return d
        raise ValueError(f"micro-batch {micro_index} outside 0..{len(self.micro) - 1}")


@dataclass(frozen=True)
class StepPlan:
    step: int
    weights_version: int
    group_size: int
    sample_ids: tuple[SampleId, ...]
    minis: tuple[MiniBatch, ...]

    @property
    def prompts(self) -> int:
        return len(self.sample_ids) // self.group_size

    def group(self, sid: SampleId) -> tuple[SampleId, ...]:
        """The ids of `sid`'s prompt group (GRPO normalises rewards within it)."""
        return tuple((sid[0], sid[1], j) for j in range(self.group_size))

    def mini_of(self, sid: SampleId) -> int:
        return mini_of_prompt(sid[1], self.prompts, len(self.minis))


def mini_of_prompt(prompt_index: int, prompts: int, updates_per_step: int) -> int:
    """The mini-batch that prompt `prompt_index`'s group trains in (`plan_step` gives each update
    prompts // updates_per_step whole groups, in prompt order): what a train device, handed a
    micro-batch's samples, reads off their sample ids."""
    return prompt_index // (prompts // updates_per_step)


def contiguous_ranges(num_micro_batches: int, devices: int) -> tuple[tuple[int, int], ...]:
    """Micro-batch ranges of `devices` train devices: as even as possible, in device order."""
    if devices < 1:
        raise ValueError(f"need at least one train device, got {devices}")
    return tuple((d * num_micro_batches // devices, (d + 1) * num_micro_batches // devices) for d in range(devices))


def tail_shares(pending: Sequence[int], devices: int, weights: Sequence[float] | None = None) -> list[list[int]]:
    """`pipeline.assist`: the micro-batches of a mini-batch still unstarted when generation ends
    (index order), cut into `devices` contiguous shares of about equal weight (their tokens; equal
    when None), in device order (the train devices first, then the rollout devices that help):
    micro-batch i goes to the share its weight's midpoint falls in. Which device computes a
    micro-batch never changes the update: the reduction sums in tree order by index
    (train/reduce.py)."""
    if devices < 1:
        raise ValueError(f"need at least one device, got {devices}")
    weights = [1.0] * len(pending) if weights is None else [max(0.0, float(w)) for w in weights]
    if len(weights) != len(pending):
        raise ValueError(f"{len(pending)} micro-batches but {len(weights)} weights")
    total = sum(weights) or 1.0
    shares: list[list[int]] = [[] for _ in range(devices)]
    before = 0.0
    for j, w in zip(pending, weights):
        shares[min(devices - 1, int(devices * (before + w / 2) / total))].append(j)
        before += w
    return shares


def plan_step(step: int, prompts: int, group_size: int, *, updates_per_step: int = 1, micro_batch_size: int = 16,
              train_devices: int = 1, mode: str = "sync") -> StepPlan:
    """The plan of step `step` with `prompts` prompts of `group_size` samples each.

    `mode` is the pipeline kind (sync, stream or async; colocated trains like sync).
    """
    if prompts < 1 or group_size < 1:
        raise ValueError(f"a step needs prompts and samples, got {prompts} prompts x {group_size}")
    if prompts % updates_per_step:
        raise ConfigError("updates_per_step", updates_per_step,
                          f"must divide the step's prompts ({prompts}) so each update gets whole groups")
    if micro_batch_size < 1:
        raise ConfigError("micro_batch_size", micro_batch_size, "must be >= 1")
    ids = tuple((step, i, j) for i in range(prompts) for j in range(group_size))
    per_update = len(ids) // updates_per_step
    minis = []
    for u in range(updates_per_step):
        mine = ids[u * per_update:(u + 1) * per_update]
        micro = tuple(mine[k:k + micro_batch_size] for k in range(0, len(mine), micro_batch_size))
        minis.append(MiniBatch(u, mine, micro, contiguous_ranges(len(micro), train_devices)))
    version = _weights_version(step, "sync" if mode == "colocated" else mode)
    return StepPlan(step, version, group_size, ids, tuple(minis))


def micro_normaliser(lengths: Sequence[int], loss_agg: str) -> float:
    """One micro-batch's normaliser: its response tokens (loss_agg token) or its responses
    (sequence, sequence_sum, and constant, whose loss divides each micro-batch's sum by
    max_new_tokens itself: algo/losses.py `aggregate`)."""
    if loss_agg == "token":
        return float(sum(lengths))
    if loss_agg in ("sequence", "sequence_sum", "constant"):
        return float(len(lengths))
    raise ConfigError("loss_agg", loss_agg, "allowed: token, sequence, sequence_sum, constant")


def loss_normaliser(micro_lengths: Sequence[Sequence[int]], loss_agg: str) -> float:
    """A mini-batch's normaliser from its micro-batches' response lengths, summed in index order."""
    return sum(micro_normaliser(lengths, loss_agg) for lengths in micro_lengths)


def pack_rows(lengths: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """How one micro-batch's sequences share rows of a packed forward: positions into `lengths`.

    `lengths`: each sequence's prompt + response tokens, in the micro-batch's sample-id order.
    Every row holds at most max(lengths) tokens; sequences go longest first (ties by position)
    into the first row with room (first-fit decreasing), and each row lists its sequences in
    position order. A pure function of the lengths, which are functions of the sample ids, so
    the packing is as canonical as the micro-batch itself (invariant 3) and a row wastes only
    its tail, never the gap between a short sequence and the longest one.
    """
    if not lengths or min(lengths) < 1:
        raise ValueError(f"every sequence needs at least one token, got lengths {list(lengths)}")
    capacity = max(lengths)
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = next((r for r, free in enumerate(room) if free >= lengths[i]), len(rows))
        if r == len(rows):
            rows.append([])
            room.append(capacity)
        rows[r].append(i)
        room[r] -= lengths[i]
    return tuple(tuple(sorted(row)) for row in rows)


@dataclass(frozen=True)
class MicroStats:
    """What one micro-batch's forward/backward reports for the step's statistics."""

    loss_sum: float  # its summed loss (divided by the step's normaliser, never its own)
    normaliser: float  # micro_normaliser of its samples
    clipped_tokens: int  # response tokens whose ratio the PPO clip cut
    kl_sum: float  # summed k3 KL to the reference over its response tokens
    tokens: int  # its response tokens
    entropy_sum: float = 0.0  # summed policy entropy over its response tokens (a metric; no gradient)
    mismatch: MismatchStats = MismatchStats()  # its share of the rollout/trainer log-prob mismatch
    clipped_responses: int = 0  # responses with a token the clip cut (sequence ratios: whose ratio it cut)
    responses: int = 0  # its responses


def step_stats(micro: Sequence[MicroStats], grad_norms: Sequence[float]) -> dict[str, float]:
    """A step's training statistics: the loss over the step's normaliser, the mean gradient norm of
    its updates (before clipping), the clipped share of response tokens and of responses, the mean KL and policy
    entropy per response token, the rollout/trainer mismatch (`mismatch/...`, policy/mismatch.py) and the
    off-policy correction's weights (`correction/...`).
    `micro` in micro-batch index order (mini-batch by mini-batch), so the sums are the same
    whoever computes them."""
    tokens = max(1, sum(m.tokens for m in micro))
    return {
        "loss": sum(m.loss_sum for m in micro) / max(1e-12, sum(m.normaliser for m in micro)),
        "grad_norm": sum(grad_norms) / len(grad_norms),
        "clip_frac": sum(m.clipped_tokens for m in micro) / tokens,
        # TRL's clip_ratio/region_mean under sequence-level ratios counts sequences, not tokens
        "clip_frac_responses": sum(m.clipped_responses for m in micro) / max(1, sum(m.responses for m in micro)),
        "kl": sum(m.kl_sum for m in micro) / tokens,
        "entropy": sum(m.entropy_sum for m in micro) / tokens,
        **mismatch_metrics([m.mismatch for m in micro]),
        **correction_metrics([m.mismatch for m in micro]),
    }


__all__ = ["MiniBatch", "MicroStats", "StepPlan", "SampleId", "contiguous_ranges", "plan_step",
           "mini_of_prompt", "tail_shares", "micro_normaliser", "loss_normaliser", "pack_rows", "step_stats"]
