"""Admission: what a generation request must be for a rollout engine to take it. Torch-free.

Both engines (Poise's, `rollout/engine.py`, and vLLM's, `rollout/vllm_engine.py`) check each request
with `admit`, so a request one engine takes the other takes too, and a bad one gets the same line
from either: which backend serves a sample must not decide whether it runs.
"""

from __future__ import annotations

import operator
from typing import Collection, Sequence

from poise.errors import PoiseError
from poise.types import SampleId


class RequestError(PoiseError):
    """A request the engine cannot serve; names the request. Other requests are unaffected."""

    def __init__(self, sample_id: object, problem: str):
        self.sample_id = sample_id
        super().__init__(f"request {sample_id}: {problem}")


def admit(sample_id: SampleId, prompt: Sequence, budget: object, tokens: Sequence[int], turn: object, *,
          known: Collection[SampleId], vocab_size: int, context: int) -> list[int]:
    """The request's prompt as plain ints (numpy and 0-d tensor ids included), or RequestError
    naming the request and the fix. `budget`: its max new tokens, resolved from the engine's
    default; `tokens`: a partial sample's response so far (resume); `known`: the sample ids queued
    or running on the engine; `context`: the engine's tokens per sequence."""
    if not (isinstance(sample_id, tuple) and len(sample_id) == 3 and all(isinstance(i, int) for i in sample_id)):
        raise RequestError(sample_id, "sample_id must be an int triple (step, prompt_index, sample_index)")
    if sample_id in known:
        raise RequestError(sample_id, "is already queued or running on this engine; sample ids must be unique")
    if not prompt:
        raise RequestError(sample_id, "empty prompt; a prompt needs at least one token")
    try:
        ids = [operator.index(t) for t in prompt]
    except TypeError:
        raise RequestError(sample_id, f"prompt ids must be integers, got {list(prompt[:5])!r}...") from None
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(sample_id, f"prompt token {bad[0]!r} is outside the vocabulary [0, {vocab_size})")
    if len(ids) >= context:
        raise RequestError(sample_id, f"prompt of {len(ids)} tokens leaves no room in the context of {context}; "
                                      f"shorten the prompt to at most {context - 1} tokens or raise "
                                      "rollout.max_context")
    if not isinstance(budget, int) or budget <= 0:
        raise RequestError(sample_id, f"max_new_tokens={budget!r}; it must be a positive integer")
    if tokens and (len(ids) + len(tokens) >= context or len(tokens) >= budget):
        raise RequestError(sample_id, f"partial of {len(ids)} prompt + {len(tokens)} response tokens has no room "
                                      f"left (context {context}, budget {budget}); resume it on an engine with the "
                                      "same max_context")
    if not isinstance(turn, int) or turn < 0:
        raise RequestError(sample_id, f"turn={turn!r}; it must be an integer >= 0")
    return ids
