"""What crosses process boundaries between rollout, trainer and driver: sample ids, requests, samples.

Torch-free (docs/design.md, Layers), so emulated workers, the stream generation service and the
driver pass them around without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SampleId = tuple[int, int, int]  # (step, prompt_index, sample_index)
FinishReason = Literal["eos", "stop", "length", "abort"]


@dataclass(frozen=True)
class Request:
    sample_id: SampleId
    prompt_ids: list[int] | tuple[int, ...]
    max_new_tokens: int | None = None  # None: SamplingConfig.max_new_tokens
    # an episode's turn (poise.episodes): its sampling keys are those of (sample id, turn), so turn t
    # draws fresh randomness whatever the prompt (the episode so far) it continues
    turn: int = 0


@dataclass(frozen=True)
class Sample:
    """A finished (or, with finish_reason 'abort', partial) response.

    logprobs[i] is log p(token_ids[i]) under the tempered, unfiltered distribution
    (see `sample_next`). Times come from the engine's clock.
    """

    sample_id: SampleId
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    weights_version: int
    submit_time: float
    finish_time: float
    max_new_tokens: int  # the budget it ran under; a resumed partial keeps it
    turn: int = 0  # the request's turn (a resumed partial keeps it); an episode: how many model turns it had
    # an episode (poise.episodes): 1 on each model token of token_ids, 0 on each observation token, which
    # trains nobody and counts in no normaliser; None: every token is the model's (a single answer)
    loss_mask: tuple[int, ...] | None = None
    # partial rollouts (docs/partial-rollouts.md): the weights version that produced each token of token_ids; a
    # sample carrying it may continue under newer weights. None: every token was made by weights_version
    token_versions: tuple[int, ...] | None = None


def trained_tokens(sample: Sample) -> int:
    """The tokens of a sample the loss trains on: its model tokens (an episode's observations excluded)."""
    return len(sample.token_ids) if sample.loss_mask is None else sum(sample.loss_mask)


def final_turn(sample: Sample) -> tuple[int, ...]:
    """The tokens of an episode's last model turn (what reward functions score); a single answer whole."""
    if sample.loss_mask is None:
        return tuple(sample.token_ids)
    start = len(sample.loss_mask)
    while start > 0 and sample.loss_mask[start - 1] == 1:
        start -= 1
    return tuple(sample.token_ids[start:])


__all__ = ["SampleId", "FinishReason", "Request", "Sample", "trained_tokens", "final_turn"]
