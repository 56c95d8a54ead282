"""The pipeline vocabulary and the rules the runtime driver and the simulated driver must agree
on (docs/design.md invariants 3 and 4), as pure functions so neither can drift from the other.

    PipelineConfig(mode, streaming)      the `pipeline:` section of `poise train` and of scenarios
    pipeline_kind(mode, streaming)       sync | stream | async: what the allocator, the resize
                                         controller, the simulator and the step plan take
    weights_version(step, kind)          the weights version step `step` generates with

The first two are the config layer's (poise.config.policy), which names the kinds the section allows.
"""

from __future__ import annotations

from poise.config.policy import PIPELINE_KINDS, PipelineConfig, pipeline_kind
from poise.errors import ConfigError


def weights_version(step: int, kind: str) -> int:
    """sync/stream: step k generates with version k (the weights after k updates); async
    (one-step staleness, StreamRL §4.1): version k-1, so generation of step k overlaps training
    of step k-1. Step 0 of async has only version 0 to use."""
    if kind in ("sync", "stream"):
        return step
    if kind == "async":
        return max(step - 1, 0)
    raise ConfigError("pipeline kind", kind, f"allowed: {', '.join(PIPELINE_KINDS)}")


__all__ = ["PIPELINE_KINDS", "PipelineConfig", "pipeline_kind", "weights_version"]
