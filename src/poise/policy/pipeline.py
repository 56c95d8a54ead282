"""The pipeline vocabulary and the rules the runtime driver and the simulated driver must agree
on (docs/design.md invariants 3 and 4), as pure functions so neither can drift from the other.

    PipelineConfig(mode, streaming)      the `pipeline:` section of `poise train` and of scenarios
    pipeline_kind(mode, streaming)       sync | stream | async: what the allocator, the resize
                                         controller, the simulator and the step plan take
    weights_version(step, kind)          the weights version step `step` generates with
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from poise.errors import ConfigError
from poise.schema import help_field

PIPELINE_KINDS = ("sync", "stream", "async")


@dataclass(frozen=True)
class PipelineConfig:
    mode: Literal["colocated", "sync", "async"] = help_field(
        "sync", "colocated: one process, the semantic reference (poise train only); sync: disaggregated, samples "
                "of step k use weights k; async: samples of step k use weights k-1 exactly (one-step overlap)")
    streaming: bool = help_field(True, "sync: train on samples as they arrive (dynamic-batch pipelining, StreamRL "
                                       "§4.1); false waits for the whole batch. async trains each step's batch whole, "
                                       "generated during the step before")
    assist: bool = help_field(False, "sync: each role lends its idle devices to the other. The train devices, "
                                     "which hold the step's weights while it generates, generate too; when "
                                     "generation ends, the rollout devices (idle until the weight sync, holding "
                                     "the same weights) compute gradients of the first mini-batch's micro-batches "
                                     "not yet started, beside the train devices, which alone hold the optimizer "
                                     "and step. Samples and update are the same, bit for bit. Not in async (every "
                                     "device is busy there)")

    @property
    def kind(self) -> str:
        return pipeline_kind(self.mode, self.streaming)

    @classmethod
    def of_kind(cls, kind: str) -> "PipelineConfig":
        """The section that selects pipeline kind `kind` (sync, stream or async)."""
        if kind not in PIPELINE_KINDS:
            raise ConfigError("pipeline kind", kind, f"allowed: {', '.join(PIPELINE_KINDS)}")
        return cls("async" if kind == "async" else "sync", kind == "stream")


def pipeline_kind(mode: str, streaming: bool) -> str:
    """sync (no overlap; colocated trains like it), stream (sync with dynamic-batch pipelining) or
    async (one-step staleness: a step's samples are all in before it trains, so streaming changes
    nothing)."""
    if mode == "async":
        return "async"
    if mode == "sync":
        return "stream" if streaming else "sync"
    if mode == "colocated":
        return "sync"
    raise ConfigError("pipeline.mode", mode, "allowed: colocated, sync, async")


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
