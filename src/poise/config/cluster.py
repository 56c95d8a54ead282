"""The `cluster:` and `emulation:` sections: the devices of a job, and emulated compute."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from poise.schema import check, help_field


AUTO_EMULATED_PROCESSES = 16  # emulation.devices_per_process auto: at most this many actor processes


@dataclass(frozen=True)
class ClusterConfig:
    """The Ray pool of a disaggregated job (a scenario's `cluster:` is poise.sim.scenario.SimClusterConfig)."""

    devices: int = help_field(4, "devices (one worker actor each) in the job's placement group")
    device: Literal["cpu", "cuda"] = help_field("cpu", "cpu: each device is a CPU worker with "
                                                       "threads_per_device threads; cuda: one GPU per device")
    threads_per_device: int = help_field(1, "torch threads per device (pinned in bitwise mode)")
    gpus_per_device: float = help_field(1.0, "cuda: the share of a GPU each device holds; below 1 several devices "
                                             "share one GPU (0.5: two per GPU, for a one-GPU machine) and their "
                                             "collectives go over gloo, since NCCL refuses two ranks on one GPU")
    split: tuple[int, ...] = help_field((), "[rollout devices, train devices]; empty = the allocator decides")
    address: str | None = help_field(None, "join this Ray cluster (host:port); null starts a local Ray")
    connect_timeout_s: float = help_field(20.0, "give up joining a cluster or placing devices after this long")
    compute: Literal["real", "emulated"] = help_field("real", "emulated: the same actors with engine and "
                                                              "trainer compute replaced by sleeps from the cost model")
    profile: str | None = help_field(None, "a `poise profile` JSON of this machine: the resize controller's "
                                     "cost model on real compute (default: the built-in model, calibrated "
                                     "to the measured step phases)")
    reserve_devices: int = help_field(0, "devices placed at start in a second placement group, idle, that may "
                                         "join the job as rollout instances (scale:)")
    step_timeout_s: float = help_field(600.0, "deadline of every wait on a device, restarted by each result that "
                                              "arrives (a generation with no finished sample or engine step, a "
                                              "micro-batch, an update, a weight sync, a checkpoint) and of gloo "
                                              "collectives; a device silent that long stops the run with one line")
    storage: Literal["auto", "shared", "driver"] = help_field(
        "auto", "how devices reach the driver's run.dir for checkpoints: auto probes each Ray node (one that "
                "does not see run.dir sends and receives checkpoints through the driver), shared trusts every "
                "node to see it, driver sends every checkpoint byte through the driver")
    shard: Literal["none", "optimizer", "full"] = help_field(
        "none", "none: every train device holds the whole AdamW state; optimizer: each of the W train devices "
                "owns the state of 1/W of the parameters (whole tensors), steps them and all-gathers them; full: "
                "each holds only its 1/W of the parameters too, gathers each module's for its forward and "
                "backward and sends each gradient to its owner (micro-batches in lockstep rounds). All three "
                "give the same bits and write the same checkpoint bytes")
    max_recoveries: int = help_field(3, "worker deaths a run survives (each: the dead actor replaced, the state "
                                        "restored from a surviving train device, the step run again); 0: stop "
                                        "at the first")

    def __post_init__(self) -> None:
        check(self.devices >= 2, "devices", self.devices,
              "a disaggregated job needs at least 2 devices (one rollout, one train); use pipeline.mode=colocated for 1")
        check(self.threads_per_device >= 1, "threads_per_device", self.threads_per_device, "must be >= 1")
        check(0 < self.gpus_per_device <= 1, "gpus_per_device", self.gpus_per_device,
              "must be in (0, 1]: 1 = a GPU per device, 0.5 = two devices per GPU")
        check(self.gpus_per_device == 1 or self.device == "cuda", "gpus_per_device", self.gpus_per_device,
              "shares GPUs, so it needs cluster.device=cuda; drop it on CPU")
        if self.split:
            check(len(self.split) == 2, "split", list(self.split), "give [rollout devices, train devices]")
            check(min(self.split) >= 1, "split", list(self.split),
                  "both roles need at least one device, e.g. [2, 2]")
            check(sum(self.split) == self.devices, "split", list(self.split),
                  f"must add up to cluster.devices ({self.devices})")
        check(self.connect_timeout_s > 0, "connect_timeout_s", self.connect_timeout_s, "must be > 0")
        check(self.reserve_devices >= 0, "reserve_devices", self.reserve_devices, "must be >= 0")
        check(self.step_timeout_s > 0, "step_timeout_s", self.step_timeout_s, "must be > 0 seconds, e.g. 600")
        check(self.max_recoveries >= 0, "max_recoveries", self.max_recoveries, "must be >= 0")


@dataclass(frozen=True)
class EmulationConfig:
    """What `cluster.compute: emulated` replaces compute with (poise.runtime.emulated)."""

    scenario: str = help_field("streamrl-pipeline", "simulator scenario (built-in name or YAML path) whose workload "
                                                    "(prompts, output lengths) and cost model apply; dispatch, "
                                                    "pipeline and micro-batching are this config's")
    overrides: tuple[str, ...] = help_field((), "dotted overrides of the scenario, e.g. "
                                                "['workload.prompts_per_step=16']")
    time_scale: float = help_field(0.1, "wall seconds slept per cost-model second (0.1: a modelled 60 s step "
                                        "sleeps 6 s)")
    devices_per_process: int = help_field(0, "emulated devices hosted by one Ray actor process (each keeps its own "
                                             "thread and call order); 0 = auto: one each up to 16 devices, then "
                                             "as many as keep 16 processes")

    def __post_init__(self) -> None:
        check(self.time_scale > 0, "time_scale", self.time_scale, "must be > 0, e.g. 0.1")
        check(self.devices_per_process >= 0, "devices_per_process", self.devices_per_process,
              "must be >= 0 (0 = auto, 1 = a process per device)")

    def per_process(self, devices: int) -> int:
        """Emulated devices per actor process for a job of `devices` (pool and reserve)."""
        return self.devices_per_process or max(1, -(-devices // AUTO_EMULATED_PROCESSES))
