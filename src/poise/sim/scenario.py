"""Scenario config: one YAML file describes a simulated job end to end.

`load_scenario("dynaresize-8xh20", ["resize.policy=static", "split=[5,3]"])` finds a built-in
scenario (src/poise/sim/scenarios/*.yaml) by name, or reads a YAML path, applies dotted
overrides and builds the frozen `ScenarioConfig` (poise.schema: unknown keys and bad values are
one-line ConfigErrors that name the key and the fix).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from poise.errors import PoiseError
from poise.policy.controller import ControllerConfig
from poise.policy.cost import CostConfig
from poise.policy.split import Split, parse_splits
from poise.schema import apply_overrides, build, check, help_factory, help_field, read_yaml
from poise.sim.workload import WorkloadConfig

SCENARIO_DIR = Path(__file__).parent / "scenarios"


@dataclass(frozen=True)
class ClusterConfig:
    devices: int = help_field(8, "devices in the pool (rollout + train)")
    devices_per_instance: int = help_field(1, "devices per rollout instance (tensor parallel degree)")
    batch_cap: int = help_field(64, "live-batch cap of a rollout instance (KV-cache slots)")
    batch_caps: tuple[int, ...] = help_field((), "caps the allocator may choose from; empty = batch_cap only")
    micro_batches: int = help_field(8, "micro-batches per step (streaming trains them as they complete)")

    def __post_init__(self) -> None:
        check(self.devices >= 2, "cluster.devices", self.devices, "need at least 2 devices (one per role)")
        check(self.devices_per_instance >= 1, "cluster.devices_per_instance", self.devices_per_instance, "must be >= 1")
        check(self.batch_cap >= 1, "cluster.batch_cap", self.batch_cap, "must be >= 1 slot")
        check(all(c >= 1 for c in self.batch_caps), "cluster.batch_caps", list(self.batch_caps), "caps must be >= 1")
        check(self.micro_batches >= 1, "cluster.micro_batches", self.micro_batches, "must be >= 1")


@dataclass(frozen=True)
class ResizeConfig:
    policy: Literal["static", "dynamic"] = help_field("static", "static split, or the resize controller")
    mode: Literal["live", "hard"] = help_field("live", "live (DynaResize) or hard (stop and rebuild) resize")
    allowed_splits: tuple[Any, ...] = help_field((), "splits the controller may choose, e.g. [[6, 2], [4, 4]]; empty = all")
    inflight: Literal["drain", "abort"] = help_field(
        "drain", "async only: let in-flight generation finish on the old split before resizing "
        "(the paper's mixed step), or abort it at the decision and resume the unfinished samples "
        "as partial samples on the new split (DESIGN.md, Resize)")


@dataclass(frozen=True)
class DispatchConfig:
    policy: Literal["round_robin", "random", "least_loaded", "skew_aware"] = help_field(
        "round_robin", "how requests are spread over rollout instances")
    ranker: Literal["oracle", "random", "history", "learned"] = help_field(
        "history", "length ranker for least_loaded / skew_aware")
    long_tail_fraction: float = help_field(0.2, "share of requests treated as the long tail")
    tail_batch_cap: int = help_field(8, "batch cap of the long-tail instances")
    tail_instances: int | None = help_field(None, "long-tail instances; null = chosen per step by predicted makespan")

    def __post_init__(self) -> None:
        check(0 < self.long_tail_fraction < 1, "dispatch.long_tail_fraction", self.long_tail_fraction,
              "must be between 0 and 1, e.g. 0.2")
        check(self.tail_batch_cap >= 1, "dispatch.tail_batch_cap", self.tail_batch_cap, "must be >= 1")
        check(self.tail_instances is None or self.tail_instances >= 1, "dispatch.tail_instances",
              self.tail_instances, "must be >= 1 or null")


@dataclass(frozen=True)
class LogConfig:
    samples: bool = help_field(True, "write one `sample` event per sample")
    intervals: Literal["device", "instance", "none"] = help_field(
        "device", "`interval` events per device, per instance/role group, or none")


@dataclass(frozen=True)
class ScenarioConfig:
    name: str = help_field("custom", "scenario name")
    description: str = help_field("", "what the scenario shows")
    seed: int = help_field(0, "seed of the workload and of every random choice")
    steps: int = help_field(100, "RL steps to simulate")
    mode: Literal["sync", "stream", "async"] = help_field(
        "async", "sync; sync with streaming (dynamic-batch pipelining); async (staleness 1)")
    split: Any = help_field("auto", "initial [rollout, train] devices, or 'auto' (allocator)")
    cluster: ClusterConfig = help_factory(ClusterConfig, "devices and rollout instances")
    workload: WorkloadConfig = help_factory(WorkloadConfig, "what each step generates")
    cost: CostConfig = help_factory(CostConfig, "cost model")
    controller: ControllerConfig = help_factory(ControllerConfig, "resize controller hysteresis")
    resize: ResizeConfig = help_factory(ResizeConfig, "static or dynamic split, live or hard resize")
    dispatch: DispatchConfig = help_factory(DispatchConfig, "dispatch policy and length ranker")
    log: LogConfig = help_factory(LogConfig, "what goes into events.jsonl")

    def __post_init__(self) -> None:
        check(self.steps >= 1, "steps", self.steps, "must be >= 1")
        if self.split != "auto":
            s = Split.parse(self.split)
            check(s.devices == self.cluster.devices, "split", self.split,
                  f"must use all {self.cluster.devices} devices (cluster.devices)")
            check(s.rollout % self.cluster.devices_per_instance == 0, "split", self.split,
                  f"rollout devices must be a multiple of cluster.devices_per_instance="
                  f"{self.cluster.devices_per_instance}")
        for s in parse_splits(self.resize.allowed_splits, "resize.allowed_splits"):
            check(s.devices == self.cluster.devices, "resize.allowed_splits", s.as_list(),
                  f"every split must use all {self.cluster.devices} devices")

    def initial_split(self) -> Split | None:
        return None if self.split == "auto" else Split.parse(self.split)


def builtin_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def scenario_data(name_or_path: str) -> dict[str, Any]:
    """The raw mapping of a built-in scenario name or a YAML path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        return read_yaml(path)
    builtin = SCENARIO_DIR / f"{name_or_path}.yaml"
    if builtin.is_file():
        return read_yaml(builtin)
    raise PoiseError(f"unknown scenario '{name_or_path}'; choose one of "
                     f"{', '.join(builtin_scenarios())} or give a YAML file")


def load_scenario(name_or_path: str, overrides: list[str] | None = None) -> ScenarioConfig:
    data = scenario_data(name_or_path)
    apply_overrides(data, list(overrides or []))
    return build(ScenarioConfig, data)


__all__ = ["ClusterConfig", "ResizeConfig", "DispatchConfig", "LogConfig", "ScenarioConfig",
           "builtin_scenarios", "scenario_data", "load_scenario"]
