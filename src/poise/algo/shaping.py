"""Reward shaping on a response's length (no torch).

DAPO's soft overlong punishment (Yu et al. 2025, eq. 13): with L_max = sampling.max_new_tokens and
a buffer of L_cache tokens, a response of |y| tokens gets

    0                                   if |y| <= L_max - L_cache
    ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max

times `penalty` (verl's overlong_penalty_factor) added to its reward. Responses never exceed
L_max here (the engine stops them), so the paper's third case (-1 past L_max) is the second's end.
"""

from __future__ import annotations


def overlong_penalty(length: int, max_new_tokens: int, buffer: int, penalty: float = 1.0) -> float:
    """The (non-positive) reward added to a response of `length` tokens; 0 when `buffer` is 0."""
    if buffer <= 0:
        return 0.0
    if not 0 < buffer < max_new_tokens:
        raise ValueError(f"overlong buffer {buffer} must be in (0, max_new_tokens={max_new_tokens})")
    start = max_new_tokens - buffer
    if length <= start:
        return 0.0
    return penalty * (start - min(length, max_new_tokens)) / buffer


__all__ = ["overlong_penalty"]
