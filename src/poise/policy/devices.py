"""Device types, device groups ("datacenters") and the links that join them (StreamRL §2.2, §7.3).

StreamRL runs generation on memory-bandwidth-optimised GPUs and training on compute-optimised
ones, possibly in another datacenter. Here a job lists its device types (each a preset or its
own spec), each type sits in a device group, and groups are joined by links:

    fleet = Fleet((DeviceType("h800", 16, group="dc-train"), DeviceType("h20", 32, group="dc-gen")),
                  (Link(("dc-train", "dc-gen"), gbps=80, latency_ms=5),), reference="h800")
    cost = fleet.place(CostModel(cfg), rollout="h20", train="h800")   # each role on its type
    fleet.split_price("h20", 24, "h800", 8)                            # USD per hour

`CostModel.on_devices` (policy/cost.py) does the pricing: decode's weight and KV-cache reads
scale with memory bandwidth, its per-sequence matmuls, prefill and training with compute, the
optimizer step with memory bandwidth; a weight sync between two groups crosses their link.
The `cost:` coefficients describe the `reference` type. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from poise.errors import ConfigError
from poise.schema import check, help_field

if TYPE_CHECKING:
    from poise.policy.cost import CostModel

# Dense bf16 tensor-core TFLOPS, HBM TB/s and GB from NVIDIA's public spec sheets (H20: 148
# TFLOPS, 4.0 TB/s, 96 GB; H800 SXM and H100 SXM: 989.5 TFLOPS, 3.35 TB/s, 80 GB; A100 SXM 80GB:
# 312 TFLOPS, 2.039 TB/s). Prices are OUR ASSUMPTIONS (about 2025 cloud rental rates, USD per
# device-hour), not measurements: set `price_per_hour` to what you pay.
PRESETS: dict[str, dict[str, float]] = {
    "h20": {"tflops": 148.0, "mem_bw_tbps": 4.0, "memory_gb": 96.0, "price_per_hour": 1.00},
    "h800": {"tflops": 989.5, "mem_bw_tbps": 3.35, "memory_gb": 80.0, "price_per_hour": 2.00},
    "h100": {"tflops": 989.5, "mem_bw_tbps": 3.35, "memory_gb": 80.0, "price_per_hour": 2.50},
    "a100": {"tflops": 312.0, "mem_bw_tbps": 2.039, "memory_gb": 80.0, "price_per_hour": 1.30},
}
SPEC_FIELDS = ("tflops", "mem_bw_tbps", "memory_gb", "price_per_hour")
LOCAL_GROUP = "local"


@dataclass(frozen=True)
class DeviceType:
    """One kind of device the job may use. A preset name fills every spec left out."""

    name: str = help_field("h800", "a preset (" + ", ".join(PRESETS) + ") or your own name with every spec "
                           "below given")
    count: int = help_field(8, "devices of this type available to the job")
    tflops: float | None = help_field(None, "dense bf16 TFLOPS: prices prefill, training and decode's "
                                      "per-sequence matmuls (default: the preset's)")
    mem_bw_tbps: float | None = help_field(None, "memory bandwidth, TB/s: prices decode's weight and KV-cache "
                                           "reads and the optimizer step (default: the preset's)")
    memory_gb: float | None = help_field(None, "device memory, GB: a rollout instance must hold the weights, "
                                         "the train group the sharded training state (default: the preset's)")
    price_per_hour: float | None = help_field(None, "USD per device-hour (default: the preset's, an assumption)")
    group: str = help_field(LOCAL_GROUP, "device group (datacenter) the devices are in; groups are joined by "
                            "cluster.links")

    def __post_init__(self) -> None:
        preset = PRESETS.get(self.name)
        missing = [f for f in SPEC_FIELDS if getattr(self, f) is None]
        if preset is None and missing:
            raise ConfigError("name", self.name, f"unknown device type: use a preset ({', '.join(PRESETS)}) "
                                                 f"or give {', '.join(missing)}")
        for f in missing:  # resolved here, so a dumped config.yaml shows every spec it ran with
            object.__setattr__(self, f, preset[f])  # type: ignore[index]
        check(isinstance(self.name, str) and bool(self.name), "name", self.name, "must be a non-empty name")
        check(self.count >= 1, "count", self.count, "must be >= 1 device")
        for f in ("tflops", "mem_bw_tbps", "memory_gb"):
            check(getattr(self, f) > 0, f, getattr(self, f), "must be > 0")
        check(self.price_per_hour > 0, "price_per_hour", self.price_per_hour,  # type: ignore[operator]
              "must be > 0 USD per device-hour")
        check(bool(self.group), "group", self.group, "must be a non-empty group name")

    def spec(self) -> str:
        return (f"{self.name}: {self.tflops:g} TFLOPS, {self.mem_bw_tbps:g} TB/s, {self.memory_gb:g} GB, "
                f"${self.price_per_hour:.2f}/h, group {self.group}")


@dataclass(frozen=True)
class Link:
    """A link between two device groups; weight sync between them crosses it."""

    between: tuple[str, ...] = help_field((), "the two device groups it joins, e.g. [dc-train, dc-gen]")
    gbps: float = help_field(80.0, "bandwidth, Gbit/s (StreamRL §7.3: a dedicated 80 Gbps link)")
    latency_ms: float = help_field(5.0, "one-way latency, ms; each weight-sync bucket pays it once")

    def __post_init__(self) -> None:
        check(len(self.between) == 2 and self.between[0] != self.between[1], "between", list(self.between),
              "name two different device groups, e.g. [dc-train, dc-gen]")
        check(self.gbps > 0, "gbps", self.gbps, "must be > 0 Gbit/s")
        check(self.latency_ms >= 0, "latency_ms", self.latency_ms, "must be >= 0 ms")

    @property
    def bytes_per_s(self) -> float:
        return self.gbps * 1e9 / 8.0

    @property
    def latency_s(self) -> float:
        return self.latency_ms / 1000.0


class Fleet:
    """The device types of a job by name, their groups and the links between the groups.

    Validates the topology (names unique, links between known groups, every pair of groups
    linked) with errors keyed as in a scenario's `cluster:` section."""

    def __init__(self, types: Sequence[DeviceType], links: Sequence[Link] = (), reference: str | None = None):
        check(len(types) >= 1, "device_types", [], "list at least one device type")
        self.types: dict[str, DeviceType] = {}
        for i, t in enumerate(types):
            check(t.name not in self.types, f"device_types[{i}].name", t.name,
                  "is listed twice: give each device type once, with its count")
            self.types[t.name] = t
        groups = sorted({t.group for t in types})
        self.links: dict[frozenset[str], Link] = {}
        for i, link in enumerate(links):
            for g in link.between:
                check(g in groups, f"links[{i}].between", list(link.between),
                      f"unknown device group '{g}'; the groups are {', '.join(groups)} (each device type's group)")
            pair = frozenset(link.between)
            check(pair not in self.links, f"links[{i}].between", list(link.between), "is linked twice: keep one")
            self.links[pair] = link
        for i, a in enumerate(groups):
            for b in groups[i + 1:]:
                check(frozenset((a, b)) in self.links, "links", [list(p) for p in self.links],
                      f"device groups '{a}' and '{b}' have no link: add {{between: [{a}, {b}], gbps: ..., "
                      "latency_ms: ...}")
        name = reference or types[0].name
        if name in self.types:
            self.reference = self.types[name]
        elif name in PRESETS:
            self.reference = DeviceType(name, 1)
        else:
            raise ConfigError("cost.device", name, f"name one of {', '.join(self.types)} or a preset "
                                                   f"({', '.join(PRESETS)}): the type `cost:` was measured on")

    def __getitem__(self, name: str) -> DeviceType:
        if name not in self.types:
            raise ConfigError("device type", name, f"not in cluster.device_types: choose {', '.join(self.types)}")
        return self.types[name]

    def link(self, a: str, b: str) -> Link | None:
        """The link weight sync crosses from type `a`'s devices to type `b`'s (None: same group)."""
        ga, gb = self[a].group, self[b].group
        return None if ga == gb else self.links[frozenset((ga, gb))]

    def place(self, cost: "CostModel", rollout: str, train: str) -> "CostModel":
        """`cost` (coefficients measured on the reference type) with the rollout role priced on
        type `rollout`, the train role on `train`, and weight sync on the link between them."""
        return cost.on_devices(self.reference, self[rollout], self[train], self.link(train, rollout))

    def price_per_hour(self, counts: Mapping[str, int]) -> float:
        """USD per hour of `counts` devices of each named type."""
        return sum(self[name].price_per_hour * n for name, n in counts.items())  # type: ignore[misc]

    def split_price(self, rollout: str, n_rollout: int, train: str, n_train: int) -> float:
        """USD per hour of `n_rollout` devices of type `rollout` and `n_train` of type `train`."""
        return self[rollout].price_per_hour * n_rollout + self[train].price_per_hour * n_train  # type: ignore[operator]

    def fits(self, rollout: str, n_rollout: int, train: str, n_train: int) -> bool:
        """Whether the types have that many devices available."""
        need = {rollout: n_rollout}
        need[train] = need.get(train, 0) + n_train
        return all(n <= self[name].count for name, n in need.items())
