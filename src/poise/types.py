"""What crosses process boundaries between rollout, trainer and driver: sample ids, requests, samples.

Torch-free (DESIGN.md, Layers), so emulated workers, the stream generation service and the
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


__all__ = ["SampleId", "FinishReason", "Request", "Sample"]
