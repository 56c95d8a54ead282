"""One long-lived worker actor per device. Its role (rollout engine or train shard) changes; the
actor does not (DESIGN.md, "Device pool").

The worker holds three role objects behind the Protocols of `runtime/roles.py` and delegates to
them; real compute (`runtime/train_shard.py`, torch) and emulated compute (`runtime/emulated.py`,
sleeps priced by the cost model, no torch in the process) are two implementations of the same
roles. The rollout engine runs on its own thread (`EngineLoop`): the driver hands requests in
with `submit` and collects finished samples in batches with `take`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Literal

import ray

from poise.runtime.roles import EngineLoop

Role = Literal["rollout", "train", "idle"]


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to build its roles; each part is its own config section."""

    model: object  # poise.config.ModelConfig
    tokenizer: str
    algorithm: object  # poise.config.AlgorithmConfig
    rollout: object  # EngineConfig
    seed: int
    threads: int
    bitwise: bool
    device: str  # "cpu" | "cuda"
    emulated: object = None  # poise.runtime.emulated.EmulatedSpec: cluster.compute emulated, no model


@ray.remote
class DeviceWorker:
    def __init__(self, rank: int, world_size: int, master_port: int, spec: WorkerSpec):
        self.rank = rank
        self.role: Role = "idle"
        self.version = 0
        build = _emulated_roles if spec.emulated is not None else _real_roles
        engine, self.shard, self.sync = build(rank, world_size, master_port, spec, self._with_engine)
        self.loop = EngineLoop(engine)

    def _with_engine(self, fn):
        return self.loop.with_engine(fn)

    # ---- role and communicators ---------------------------------------------------------------
    def set_role(self, role: Role) -> Role:
        self.role = role
        return role

    def prewarm_groups(self, rank_sets: list[list[int]]) -> int:
        """Create (collectively, in this order) every group the job may use; returns cache size."""
        return self.sync.prewarm(rank_sets)

    def weights_digest(self) -> str:
        return self.shard.digest()

    def loaded_torch(self) -> bool:
        """Whether this actor's process imported torch (an emulated one must not)."""
        return "torch" in sys.modules

    # ---- rollout role -------------------------------------------------------------------------
    def submit(self, requests: list, cap: int) -> None:
        """Queue requests; at most `cap` are inside the engine at once (the dispatcher's cap)."""
        self.loop.submit(requests, cap)

    def take(self, timeout: float) -> tuple[list, int, list[tuple[float, float]]]:
        """Finished samples (waiting up to `timeout` s for the first), requests still in flight,
        and the busy intervals (wall clock) closed since the last take."""
        return self.loop.take(timeout)

    def abort_generation(self) -> tuple[list, list, list]:
        """A live resize takes this rollout device: (finished samples not yet taken, partial samples,
        requests never started); nothing stays in flight here."""
        return self.loop.abort()

    def resume_generation(self, partials: list, requests: list, cap: int) -> None:
        """Continue another device's partial samples (same tokens: DESIGN.md invariant 2), then
        its unstarted requests."""
        self.loop.resume(partials, requests, cap)

    # ---- live resize --------------------------------------------------------------------------
    def become(self, role: Role, version: int) -> int:
        """Switch role in place. To rollout: the engine starts from the weights this device holds
        (it shares the trainer's module tree) at weights `version`; the optimizer state is freed.
        To train: the weights are already those of `version` (synced as a rollout device); the
        optimizer state arrives by `stage_optimizer`. Returns the weights version held."""
        if self.role == "rollout" and self.version != version:  # a train device holds the latest by construction
            raise RuntimeError(f"device {self.rank} holds weights version {self.version}, the job is at "
                               f"{version}; a live resize happens only between a sync and the next update")
        self.version = version
        if role == "rollout" and self.role == "train":
            self.shard.drop_optimizer()
            self.loop.with_engine(lambda engine: engine.set_weights_version(version))
        self.role = role
        return self.version

    def restore_version(self, version: int) -> int:
        """Emulated compute's reload after a hard resize: no weights exist, only their version."""
        self.version = version
        self.loop.with_engine(lambda engine: engine.set_weights_version(version))
        return version

    def stage_optimizer(self, src: int, ranks: list[int], buffer_bytes: int) -> None:
        """Send (rank == src) or receive the optimizer state over the cached group of `ranks`, in the
        background; this device's next update (or checkpoint) waits for it."""
        self.shard.stage_optimizer(src, ranks, buffer_bytes)

    def staging_report(self) -> dict:
        return self.shard.staging_report()

    def groups_created_after_prewarm(self) -> int:
        """Communicators created after `prewarm_groups`: a live resize must find all it needs cached."""
        return self.sync.groups_created_after_prewarm()

    # ---- train role ---------------------------------------------------------------------------
    def train_micro_batches(self, batches: list[tuple[int, object, list[float]]]) -> list[dict]:
        """Forward/backward of each (micro-batch index, its samples' ObjectRef, their advantages), in
        the order given; returns each one's stats."""
        samples = ray.get([ref for _, ref, _ in batches])
        return [self.shard.train_micro_batch(j, s, adv) for (j, _, adv), s in zip(batches, samples)]

    def apply_update(self, num_micro_batches: int, lo: int, hi: int, normaliser: float,
                     train_ranks: list[int], after: list | None = None) -> dict:
        """One reduction + optimizer step; the leader's `after` holds every micro-batch of the
        mini-batch, so the update it publishes ends after the last one (the all-gather imposes that
        on every rank with real compute; an emulated shard has no collective)."""
        inputs_ready = None
        if after:  # every micro-batch's record: the last one's end is when the all-gather could start
            inputs_ready = max(record["end"] for records in ray.get(after) for record in records)
        out = self.shard.apply_update(num_micro_batches, lo, hi, normaliser, train_ranks, inputs_ready)
        self.version += 1
        return out

    # ---- weight sync ------------------------------------------------------------------------
    def sync_weights(self, src: int, ranks: list[int], version: int, bucket_mb: float, after: list | None = None
                     ) -> float:
        """Send or receive weights `version`; `after` holds the train leader's last update of the
        step, so a sync can be queued before that update ends (the barrier a collective is anyway)."""
        sender_ready = None
        if after:  # the leader's update record: when the sender entered the sync
            sender_ready = max(record["end"] for record in ray.get(after))
        seconds = self.sync.publish(src, ranks, version, bucket_mb, sender_ready)
        self.version = version
        return seconds

    def save_checkpoint(self, run_dir: str, step: int, version: int) -> str:
        return self.shard.save_checkpoint(run_dir, step, version)

    def load_checkpoint(self, path: str) -> tuple[int, int]:
        """Restore weights, optimizer and RNG from a checkpoint; returns (step, weights version)."""
        step, self.version = self.shard.load_checkpoint(path)
        return step, self.version

    def shutdown(self) -> None:
        self.loop.close()


def _real_roles(rank: int, world_size: int, master_port: int, spec: WorkerSpec, engine_call):
    """A model, its engine (sharing the module tree: a train->rollout switch copies no weight), a
    torch train shard and the broadcast sync, in one torch.distributed world (gloo/NCCL)."""
    import time

    import torch
    import torch.distributed as dist

    from poise.data.tokenizer import load_tokenizer
    from poise.rollout.engine import Engine
    from poise.runtime.train_shard import BroadcastSync, CommunicatorCache, TorchTrainShard
    from poise.train.setup import pin_threads
    from poise.train.trainer import PolicyTrainer

    pin_threads(spec.threads, spec.bitwise)
    torch.manual_seed(spec.seed)  # the colocated loop's RNG state, saved in checkpoints
    device = torch.device("cuda", 0) if spec.device == "cuda" else torch.device("cpu")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("nccl" if spec.device == "cuda" else "gloo",
                            init_method=f"tcp://127.0.0.1:{master_port}", rank=rank, world_size=world_size)
    comm = CommunicatorCache()
    tokenizer = load_tokenizer(spec.tokenizer, spec.model.path)
    model = _initial_policy(spec, tokenizer).to(device)
    ref = None
    if spec.algorithm.kl_coef > 0:
        ref = _initial_policy(spec, tokenizer).to(device).requires_grad_(False).eval()
    trainer = PolicyTrainer(model, spec.algorithm, tokenizer.pad_id, ref)
    engine = Engine(model, spec.rollout, spec.algorithm.sampling, spec.seed, tokenizer.eos_id, clock=time.time)

    def set_version(version: int) -> None:
        engine_call(lambda e: e.set_weights_version(version))

    shard = TorchTrainShard(rank, trainer, comm, spec.bitwise, device, set_version)
    return engine, shard, BroadcastSync(rank, model, comm, device, engine_call)


def _emulated_roles(rank: int, world_size: int, master_port: int, spec: WorkerSpec, engine_call):
    """Compute replaced by cost-model sleeps; no model, no torch, no torch.distributed world."""
    from poise.runtime.emulated import emulated_roles

    return emulated_roles(rank, spec.emulated, spec.rollout.num_slots, engine_call)


def _initial_policy(spec: WorkerSpec, tokenizer):
    """Every device builds the same initial weights: a local checkpoint or the seeded tiny model."""
    from poise.model.loading import build_tiny, load_model

    if spec.model.path is not None:
        return load_model(spec.model.path)
    return build_tiny(spec.model.tiny, tokenizer.vocab_size, spec.seed, tokenizer.eos_id, tokenizer.pad_id,
                      tokenizer.bos_id)
