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

from poise.config.algorithm import MICRO_BATCH_SIZE_HELP
from poise.errors import PoiseError
from poise.policy.controller import ControllerConfig, ResizeConfig
from poise.policy.cost import CostConfig
from poise.policy.devices import DeviceType, Fleet, Link
from poise.policy.dispatch import DispatchConfig
from poise.policy.pipeline import PipelineConfig
from poise.policy.scale import ScaleConfig
from poise.policy.split import Split, parse_splits
from poise.schema import apply_overrides, build, check, help_factory, help_field, read_yaml
from poise.sim.workload import WorkloadConfig

SCENARIO_DIR = Path(__file__).parent / "scenarios"


@dataclass(frozen=True)
class SimClusterConfig:
    """The simulated pool (`poise train`'s `cluster:` is the Ray pool: poise.config.ClusterConfig)."""

    devices: int = help_field(8, "devices in the pool (rollout + train)")
    devices_per_instance: int = help_field(1, "devices per rollout instance (tensor parallel degree)")
    batch_cap: int = help_field(64, "live-batch cap of a rollout instance (KV-cache slots)")
    batch_caps: tuple[int, ...] = help_field((), "caps the allocator may choose from; empty = batch_cap only")
    micro_batch_size: int = help_field(16, MICRO_BATCH_SIZE_HELP)
    reserve_devices: int = help_field(0, "devices outside the pool that may join as rollout instances "
                                         "(scale:), devices_per_instance at a time")
    device_types: tuple[DeviceType, ...] = help_field(
        (), "device types available, each a preset or its own spec and price (policy/devices.py); empty: "
        "`devices` identical devices priced by `cost:` as written. With types, `devices` is unused: split: auto "
        "plans the type and count of each role within budget_per_hour")
    links: tuple[Link, ...] = help_field((), "links between the device groups (datacenters) of device_types")
    budget_per_hour: float | None = help_field(None, "USD per hour the device planner may spend (split: auto); "
                                               "default: every listed device")
    rollout_type: str | None = help_field(None, "device type of the rollout role for an explicit split; "
                                          "default: the only type")
    train_type: str | None = help_field(None, "device type of the train role for an explicit split; "
                                        "default: the only type")

    def __post_init__(self) -> None:
        check(self.devices >= 2, "cluster.devices", self.devices, "need at least 2 devices (one per role)")
        check(self.devices_per_instance >= 1, "cluster.devices_per_instance", self.devices_per_instance, "must be >= 1")
        check(self.batch_cap >= 1, "cluster.batch_cap", self.batch_cap, "must be >= 1 slot")
        check(all(c >= 1 for c in self.batch_caps), "cluster.batch_caps", list(self.batch_caps), "caps must be >= 1")
        check(self.micro_batch_size >= 1, "cluster.micro_batch_size", self.micro_batch_size, "must be >= 1")
        check(self.reserve_devices >= 0, "cluster.reserve_devices", self.reserve_devices, "must be >= 0")
        if not self.device_types:
            for key in ("links", "budget_per_hour", "rollout_type", "train_type"):
                check(not getattr(self, key), key, getattr(self, key), "needs cluster.device_types: list them first")
            return
        fleet = Fleet(self.device_types, self.links)  # names unique, links between known groups
        for key in ("rollout_type", "train_type"):
            name = getattr(self, key)
            check(name is None or name in fleet.types, key, name,
                  f"unknown device type: choose one of cluster.device_types ({', '.join(fleet.types)})")
        check(self.budget_per_hour is None or self.budget_per_hour > 0, "budget_per_hour", self.budget_per_hour,
              "must be > 0 USD per hour")


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
    pipeline: PipelineConfig = help_factory(PipelineConfig, "how rollout and training are arranged (as in "
                                                            "`poise train`; colocated is not simulated)")
    split: Any = help_field("auto", "initial [rollout, train] devices, or 'auto' (allocator)")
    cluster: SimClusterConfig = help_factory(SimClusterConfig, "devices, rollout instances and micro-batches")
    workload: WorkloadConfig = help_factory(WorkloadConfig, "what each step generates")
    cost: CostConfig = help_factory(CostConfig, "cost model")
    controller: ControllerConfig = help_factory(ControllerConfig, "resize controller hysteresis")
    resize: ResizeConfig = help_factory(ResizeConfig, "static or dynamic split, live or hard resize")
    dispatch: DispatchConfig = help_factory(DispatchConfig, "dispatch policy and length ranker (as in `poise train`)")
    scale: ScaleConfig = help_factory(ScaleConfig, "elastic scale-out: reserve devices join as rollout instances")
    log: LogConfig = help_factory(LogConfig, "what goes into events.jsonl")

    def __post_init__(self) -> None:
        check(self.steps >= 1, "steps", self.steps, "must be >= 1")
        check(self.pipeline.mode != "colocated", "pipeline.mode", self.pipeline.mode,
              "the simulator models disaggregated jobs: use sync (pipeline.streaming for dynamic-batch "
              "pipelining) or async")
        check(not self.pipeline.assist or self.pipeline.mode == "sync", "pipeline.assist", True,
              "needs pipeline.mode=sync (in async the rollout devices generate the next step); set it false")
        check(self.workload.episode is None or self.resize.inflight == "drain", "resize.inflight",
              self.resize.inflight, "aborting episodes mid-turn is not simulated yet: use drain with workload.episode")
        if self.pipeline.partial:
            w = self.workload
            what = "a trace" if w.trace else "workload.drop_rate" if w.drop_rate else "workload.episode" \
                if w.episode else None
            check(what is None, "pipeline.partial_tokens", self.pipeline.partial_tokens,
                  f"partial rollouts with {what} are not simulated: set it 0, or use a parametric single-turn "
                  "workload without drop_rate")
            check(self.pipeline.overprovision <= w.prompts_per_step, "pipeline.overprovision",
                  self.pipeline.overprovision, f"must be <= workload.prompts_per_step ({w.prompts_per_step}): more "
                  "complete groups than a step trains would wait past max_staleness")
            check(self.resize.inflight == "drain", "resize.inflight", self.resize.inflight,
                  "with partial rollouts a phase hands every sample back at its end: use drain")
        fleet = self.fleet()
        if fleet is not None:
            check(self.resize.policy == "static" and not self.resize.schedule and not self.scale.active,
                  "resize.policy", self.resize.policy, "with cluster.device_types each role keeps its device "
                  "type: use static, without resize.schedule or scale")
        if self.split != "auto" and fleet is not None:
            s, roles = Split.parse(self.split), self.roles()
            check(roles is not None, "cluster.rollout_type", self.cluster.rollout_type,
                  f"an explicit split needs each role's type: set cluster.rollout_type and cluster.train_type "
                  f"(of {', '.join(fleet.types)})")
            assert roles is not None
            check(fleet.fits(roles[0], s.rollout, roles[1], s.train), "split", self.split,
                  f"needs more devices than cluster.device_types lists ({roles[0]} rollout, {roles[1]} train)")
        elif self.split != "auto":
            s = Split.parse(self.split)
            check(s.devices == self.cluster.devices, "split", self.split,
                  f"must use all {self.cluster.devices} devices (cluster.devices)")
        if self.split != "auto":
            check(s.rollout % self.cluster.devices_per_instance == 0, "split", self.split,
                  f"rollout devices must be a multiple of cluster.devices_per_instance="
                  f"{self.cluster.devices_per_instance}")
        for s in parse_splits(self.resize.allowed_splits, "resize.allowed_splits"):
            check(s.devices == self.cluster.devices, "resize.allowed_splits", s.as_list(),
                  f"every split must use all {self.cluster.devices} devices")
        if self.scale.active:
            what = "scale.schedule" if self.scale.schedule else "scale.policy"
            reserve = self.cluster.reserve_devices // self.cluster.devices_per_instance
            check(reserve >= 1, "cluster.reserve_devices", self.cluster.reserve_devices,
                  f"{what} needs reserve devices to join: give at least cluster.devices_per_instance="
                  f"{self.cluster.devices_per_instance}")
            check(self.scale.most_added(reserve) <= reserve, "scale.schedule", list(self.scale.schedule),
                  f"adds more instances than cluster.reserve_devices holds ({reserve}); add reserve devices")
            check(not self.resize.schedule and self.resize.policy == "static", what,
                  list(self.scale.schedule) or self.scale.policy,
                  "scale-out and resizing (resize.schedule or resize.policy=controller) exclude each other "
                  "for now; drop one")

    @property
    def kind(self) -> str:
        """The pipeline kind: sync, stream or async."""
        return self.pipeline.kind

    def initial_split(self) -> Split | None:
        return None if self.split == "auto" else Split.parse(self.split)

    def fleet(self) -> Fleet | None:
        """The device types, groups and links (None: identical devices, `cost:` as written)."""
        c = self.cluster
        return Fleet(c.device_types, c.links, self.cost.device) if c.device_types else None

    def roles(self) -> tuple[str, str] | None:
        """(rollout type, train type) as configured; None without device types, or when several
        types are listed and a role's type is not given (split: auto plans it)."""
        c = self.cluster
        if not c.device_types:
            return None
        only = c.device_types[0].name if len(c.device_types) == 1 else None
        rollout, train = c.rollout_type or only, c.train_type or only
        return (rollout, train) if rollout and train else None


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


def pipeline_overrides(kind: str) -> list[str]:
    """Dotted overrides that select pipeline kind `kind` (sync, stream or async), for sweeps."""
    p = PipelineConfig.of_kind(kind)
    return [f"pipeline.mode={p.mode}", f"pipeline.streaming={str(p.streaming).lower()}"]


# Top-level sections only a training config has: a file with one is `poise train`'s, not a scenario.
TRAINING_SECTIONS = ("run", "model", "data", "algorithm", "rollout", "reward", "eval", "env")


def load_scenario(name_or_path: str, overrides: list[str] | None = None) -> ScenarioConfig:
    data = scenario_data(name_or_path)
    training = [k for k in TRAINING_SECTIONS if k in data]
    if training:
        raise PoiseError(f"{name_or_path} is a training config (it has '{training[0]}:'), for poise train; this "
                         "command takes a scenario: a built-in name (poise simulate --list) or a scenario YAML")
    apply_overrides(data, list(overrides or []))
    return build(ScenarioConfig, data)


__all__ = ["SimClusterConfig", "ResizeConfig", "DispatchConfig", "PipelineConfig", "LogConfig", "ScenarioConfig",
           "builtin_scenarios", "scenario_data", "pipeline_overrides", "load_scenario"]
