"""The sections the policy layer reads (`pipeline:`, `dispatch:`, `resize:`, `controller:`, `scale:`)
of `poise train` and of scenarios, with the pipeline vocabulary they name."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from poise.config.split import Split
from poise.errors import ConfigError
from poise.schema import check, help_field

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
    max_staleness: int | None = help_field(
        None, "async only: the most weights versions a trained token may lag the weights it trains against. "
              "null = 1 (one-step-off async); 0 = the sync loop; >= 2 needs partial_tokens > 0 "
              "(docs/partial-rollouts.md)")
    partial_tokens: int = help_field(
        0, "async only: partial rollouts. Each unfinished sample decodes at most this many tokens per step and "
           "keeps generating across weight updates (each token records its weights version); 0 = off, every "
           "sample runs to its end within one step")
    overprovision: int = help_field(
        0, "with partial_tokens: prompt groups kept generating beyond algorithm.prompts_per_step (APRIL); the "
           "groups not trained this step join later steps")

    def __post_init__(self) -> None:
        for key, value, on in (("pipeline.max_staleness", self.max_staleness, self.max_staleness is not None),
                               ("pipeline.partial_tokens", self.partial_tokens, self.partial_tokens != 0),
                               ("pipeline.overprovision", self.overprovision, self.overprovision != 0)):
            check(not on or self.mode == "async", key, value,
                  f"needs pipeline.mode=async (with {self.mode} every sample uses its step's own weights); "
                  "set pipeline.mode=async or drop it")
        check(self.max_staleness is None or self.max_staleness >= 0, "pipeline.max_staleness", self.max_staleness,
              "must be >= 0 (0 = sync, 1 = one-step-off async) or null")
        check(self.partial_tokens >= 0, "pipeline.partial_tokens", self.partial_tokens, "must be >= 0 (0 = off)")
        check(self.overprovision >= 0, "pipeline.overprovision", self.overprovision, "must be >= 0 (0 = off)")
        check(self.staleness < 2 or self.partial_tokens > 0, "pipeline.max_staleness", self.max_staleness,
              "above 1 needs partial rollouts (a sample spans several weights versions only when it keeps "
              "generating across updates); set pipeline.partial_tokens > 0, e.g. 32, or max_staleness <= 1")
        check(self.partial_tokens == 0 or self.staleness >= 1, "pipeline.partial_tokens", self.partial_tokens,
              "needs pipeline.max_staleness >= 1 (0 is the sync loop, which generates each step whole); "
              "raise max_staleness or set partial_tokens=0")
        check(self.overprovision == 0 or self.partial_tokens > 0, "pipeline.overprovision", self.overprovision,
              "needs partial rollouts (the surplus groups keep generating into later steps); set "
              "pipeline.partial_tokens > 0, e.g. 32, or overprovision=0")

    @property
    def staleness(self) -> int:
        """The most weights versions a trained token lags: max_staleness, or 1 (async) / 0 when unset."""
        if self.max_staleness is not None:
            return self.max_staleness
        return 1 if self.mode == "async" else 0

    @property
    def partial(self) -> bool:
        """Partial rollouts: samples keep generating across weight updates (pipeline.partial_tokens)."""
        return self.partial_tokens > 0

    @property
    def kind(self) -> str:
        if self.mode == "async" and self.max_staleness == 0:  # staleness 0 is the sync loop, byte for byte
            return pipeline_kind("sync", self.streaming)
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


@dataclass(frozen=True)
class ControllerConfig:
    threshold: float = help_field(0.15, "relative predicted gain of the best split over the "
                                  "current one that counts as an imbalance signal (0.15 = 15%)")
    consecutive: int = help_field(3, "signals in the same direction in a row before a resize")
    dwell_s: float = help_field(0.0, "seconds of run time the signal must persist before a resize")
    cooldown_steps: int = help_field(10, "steps after a resize during which no resize happens")
    break_even: bool = help_field(True, "resize only if gain/step x expected persistence exceeds "
                                  "the predicted resize cost")
    window: int = help_field(3, "steps whose predictions are averaged (smooths one step's tail)")
    regime_margin: float = help_field(0.15, "a regime (run of steps wanting the same split) ends "
                                      "when another split is predicted this much faster")
    persistence_prior_steps: float = help_field(20.0, "expected regime length in steps before "
                                                "any regime has been seen to end")

    def __post_init__(self) -> None:
        check(self.threshold >= 0, "controller.threshold", self.threshold,
              "must be >= 0 (a fraction of the step time, e.g. 0.15)")
        check(self.consecutive >= 1, "controller.consecutive", self.consecutive,
              "must be >= 1 signal")
        check(self.dwell_s >= 0, "controller.dwell_s", self.dwell_s, "must be >= 0 seconds")
        check(self.cooldown_steps >= 0, "controller.cooldown_steps", self.cooldown_steps,
              "must be >= 0 steps; use 0 for no cooldown")
        check(self.window >= 1, "controller.window", self.window, "must be >= 1 step")
        check(self.regime_margin >= 0, "controller.regime_margin", self.regime_margin,
              "must be >= 0 (a fraction of the step time, e.g. 0.15)")
        check(self.persistence_prior_steps > 0, "controller.persistence_prior_steps",
              self.persistence_prior_steps, "must be > 0 steps")


@dataclass(frozen=True)
class ResizeConfig:
    """When the split changes and how (one section for `poise train` and scenarios)."""

    policy: Literal["static", "controller"] = help_field(
        "static", "static: the split holds (unless `schedule` says otherwise); controller: the "
        "hysteresis resize controller decides once per step")
    mode: Literal["live", "hard"] = help_field("live", "live (DynaResize) or hard (stop and rebuild) resize")
    allowed_splits: tuple[Any, ...] = help_field((), "splits the controller may choose, e.g. [[6, 2], [4, 4]]; empty = all")
    schedule: tuple[Any, ...] = help_field(
        (), "forced resizes, e.g. [{at_step: 2, split: [1, 3]}]: step 2 and later run on 1+3 "
        "(for tests and benchmarks; with policy static)")
    inflight: Literal["drain", "abort"] = help_field(
        "drain", "simulator, async only: let in-flight generation finish on the old split before "
        "resizing (the paper's mixed step), or abort it at the decision and resume the unfinished "
        "samples as partial samples on the new split (docs/design.md, Resize). The runtime always aborts")
    staging_mb: float = help_field(
        4.0, "live resize: host buffer, MiB, through which a device joining the trainer receives "
        "its optimizer state chunk by chunk")

    def __post_init__(self) -> None:
        check(self.staging_mb > 0, "resize.staging_mb", self.staging_mb, "must be > 0 MiB, e.g. 4")
        check(not (self.schedule and self.policy == "controller"), "resize.schedule", list(self.schedule),
              "a forced schedule and resize.policy=controller exclude each other; drop one")
        self.scheduled()  # a malformed entry fails here, with the entry's index

    def scheduled(self) -> dict[int, Split]:
        """The schedule as {step that first runs on the split: split}."""
        out: dict[int, Split] = {}
        entries = _entries(self.schedule, "resize", ("at_step", "split"), "{at_step: N, split: [rollout, train]}")
        for key, entry in entries:
            at = _whole(entry["at_step"], f"{key}.at_step", 1, "step 0 runs on cluster.split")
            check(at not in out, f"{key}.at_step", at, "two entries name the same step; keep one")
            out[at] = Split.parse(entry["split"], f"{key}.split")
        return dict(sorted(out.items()))


@dataclass(frozen=True)
class DispatchConfig:
    """The `dispatch:` section of `poise train` and of scenarios."""

    policy: Literal["skew_aware", "least_loaded", "round_robin", "random"] = help_field(
        "skew_aware", "which rollout instance gets which prompt group (StreamRL §5.3 by default)")
    ranker: Literal["history", "learned", "lm", "random", "oracle"] = help_field(
        "history", "output-length ranker for skew_aware and least_loaded; history is best on prompts seen in "
                   "earlier epochs, lm (a small transformer, torch: cluster.compute=real only) on unseen ones "
                   "(benchmarks/rankers.py); oracle knows the true lengths, so only the simulator and "
                   "cluster.compute=emulated have it")
    long_tail_fraction: float = help_field(0.2, "predicted-longest share of the prompts sent to long-tail instances")
    tail_batch_cap: int = help_field(8, "live-batch cap of the long-tail instances")
    tail_instances: int | None = help_field(None, "long-tail instances; null = chosen per step by predicted makespan")

    def __post_init__(self) -> None:
        check(0 < self.long_tail_fraction < 1, "long_tail_fraction", self.long_tail_fraction,
              "must be between 0 and 1, e.g. 0.2")
        check(self.tail_batch_cap >= 1, "tail_batch_cap", self.tail_batch_cap, "must be >= 1")
        check(self.tail_instances is None or self.tail_instances >= 1, "tail_instances", self.tail_instances,
              "must be >= 1 or null")


@dataclass(frozen=True)
class ScaleConfig:
    """Whether reserve devices join as rollout instances, and when (`scale:` of `poise train`
    and of scenarios; the reserve itself is `cluster.reserve_devices`)."""

    policy: Literal["static", "controller"] = help_field(
        "static", "static: the rollout pool holds (unless `schedule` says otherwise); controller: a "
        "reserve device joins as a rollout instance when generation lags training")
    schedule: tuple[Any, ...] = help_field(
        (), "forced joins, e.g. [{after_step: 1, add: 1}]: one reserve device joins after step 1's weight "
        "sync (for tests and benchmarks; with policy static)")
    threshold: float = help_field(
        0.10, "generation lags when its span exceeds the train side's busy time by this fraction "
        "(0.10 = 10%; see policy/scale.py for why)")
    consecutive: int = help_field(3, "lagging steps in a row before a device joins")
    cooldown_steps: int = help_field(3, "steps after a join during which no other joins (its effect "
                                     "shows from the second or third step after it)")
    max_instances: int = help_field(0, "instances the controller may add in all; 0 = every reserve device")

    def __post_init__(self) -> None:
        check(self.threshold >= 0, "scale.threshold", self.threshold,
              "must be >= 0 (a fraction of the train time, e.g. 0.10)")
        check(self.consecutive >= 1, "scale.consecutive", self.consecutive, "must be >= 1 step")
        check(self.cooldown_steps >= 0, "scale.cooldown_steps", self.cooldown_steps,
              "must be >= 0 steps; use 0 for no cooldown")
        check(self.max_instances >= 0, "scale.max_instances", self.max_instances,
              "must be >= 0; 0 = every reserve device")
        check(not (self.schedule and self.policy == "controller"), "scale.schedule", list(self.schedule),
              "a forced schedule and scale.policy=controller exclude each other; drop one")
        self.scheduled()  # a malformed entry fails here, with the entry's index

    @property
    def active(self) -> bool:
        """Whether any device may join (a schedule or the controller)."""
        return bool(self.schedule) or self.policy == "controller"

    def scheduled(self) -> dict[int, int]:
        """The schedule as {step after which devices join: how many}."""
        out: dict[int, int] = {}
        for key, entry in _entries(self.schedule, "scale", ("after_step", "add"), "{after_step: N, add: K}"):
            at = _whole(entry["after_step"], f"{key}.after_step", 0,
                        "the step after whose weight sync the devices join")
            add = _whole(entry["add"], f"{key}.add", 1, "rollout instances that join")
            check(at not in out, f"{key}.after_step", at, "two entries name the same step; merge them")
            out[at] = add
        return dict(sorted(out.items()))

    def most_added(self, reserve_instances: int) -> int:
        """How many instances may join over the job: the schedule's total, or the controller's cap."""
        if self.schedule:
            return sum(self.scheduled().values())
        if self.policy == "controller":
            return min(self.max_instances, reserve_instances) if self.max_instances else reserve_instances
        return 0


def _entries(schedule: tuple[Any, ...], section: str, names: tuple[str, str], form: str
             ) -> Iterator[tuple[str, dict]]:
    """Each entry of `{section}.schedule` with its key, checked to be a mapping of `names` alone
    (`form` shows one)."""
    for i, entry in enumerate(schedule):
        key = f"{section}.schedule[{i}]"
        check(isinstance(entry, dict) and set(entry) == set(names), key, entry, f"each entry is {form}")
        yield key, entry


def _whole(value: Any, key: str, least: int, meaning: str) -> int:
    """`value`, checked to be an integer (not a bool) >= `least`; `meaning` says what it counts."""
    check(isinstance(value, int) and not isinstance(value, bool) and value >= least, key, value,
          f"must be an integer >= {least} ({meaning})")
    return value
