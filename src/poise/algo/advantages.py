"""GRPO outcome advantages of one prompt group, in plain Python floats (no torch).

The colocated loop and the runtime's trainer group both call this, one group at a time, so a
sample's advantage is a function of its group's rewards alone: not of how many other groups were
computed beside it, nor of the machine's vector width. (A torch reduction over a [prompts, G]
table need not give a row the bits it gets in a [1, G] table: on an AVX-512 machine the mean of a
row differed in the last bit, and the colocated loop and the runtime trained apart.) `math.fsum`
rounds once, so the result does not depend on the order the rewards are listed in either.
"""

from __future__ import annotations

import math
from typing import Sequence


def group_advantages(rewards: Sequence[float], scale: bool = True, eps: float = 1e-6) -> list[float]:
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
