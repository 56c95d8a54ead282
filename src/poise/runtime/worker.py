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

    # ---- train role ---------------------------------------------------------------------------
    def train_micro_batch(self, index: int, samples: list, advantages: list[float]) -> dict:
        return self.shard.train_micro_batch(index, samples, advantages)

    def apply_update(self, num_micro_batches: int, lo: int, hi: int, normaliser: float,
                     train_ranks: list[int], after: list | None = None) -> dict:
        """One reduction + optimizer step; `after` holds every micro-batch of the mini-batch, so no
        rank's update ends before the last micro-batch does (what the all-gather imposes)."""
        if after:
            ray.wait(after, num_returns=len(after))
        out = self.shard.apply_update(num_micro_batches, lo, hi, normaliser, train_ranks)
        self.version += 1
        return out

    # ---- weight sync ------------------------------------------------------------------------
    def sync_weights(self, src: int, ranks: list[int], version: int, bucket_mb: float, after: list | None = None
                     ) -> float:
        """Send or receive weights `version`; `after` holds the train leader's last update of the
        step, so a sync can be queued before that update ends (the barrier a collective is anyway)."""
        if after:
            ray.wait(after, num_returns=len(after))
        seconds = self.sync.publish(src, ranks, version, bucket_mb)
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
