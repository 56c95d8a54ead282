"""Pipeline rules the runtime driver and the simulated driver must agree on (DESIGN.md
invariants 3 and 4), as pure functions so neither can drift from the other.

    weights_version(step, mode)            the weights version step `step` generates with
    micro_batch_of(prompt_index, n_prompts, micro_batches)
                                           the micro-batch a prompt's samples train in
"""

from __future__ import annotations

from poise.errors import ConfigError

PIPELINE_MODES = ("sync", "stream", "async")


def weights_version(step: int, mode: str) -> int:
    """sync/stream: step k generates with version k (the weights after k updates); async
    (one-step staleness, StreamRL §4.1): version k-1, so generation of step k overlaps training
    of step k-1. Step 0 of async has only version 0 to use."""
    if mode in ("sync", "stream"):
        return step
    if mode == "async":
        return max(step - 1, 0)
    raise ConfigError("mode", mode, f"allowed: {', '.join(PIPELINE_MODES)}")


def micro_batch_of(prompt_index: int, n_prompts: int, micro_batches: int) -> int:
    """Micro-batches are contiguous ranges of prompt index, never arrival order (invariant 3),
    and a prompt's whole group lands in one (GRPO normalises advantages within the group)."""
    if not 0 <= prompt_index < n_prompts:
        raise ValueError(f"prompt index {prompt_index} outside [0, {n_prompts})")
    return prompt_index * max(1, micro_batches) // n_prompts
