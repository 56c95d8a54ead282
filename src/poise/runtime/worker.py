"""One long-lived worker actor per device. Its role (rollout engine or train shard) changes; the
actor does not (DESIGN.md, "Device pool").

Every worker builds the same initial policy, joins one torch.distributed world (gloo on CPU,
NCCL on CUDA) and keeps a communicator cache keyed by the frozen set of ranks. A rollout worker
serves requests with the continuous-batching engine and hands finished samples out by `poll`.
A train worker computes the gradient of each canonical micro-batch it is given, keeps the
aligned tree nodes of its contiguous range (train/reduce.py), gathers every train rank's nodes,
combines them in the one fixed tree order and takes the same optimizer step as every other
train rank — so the update is the colocated loop's, bit for bit, for any number of train devices.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Literal

import ray

Role = Literal["rollout", "train", "idle"]


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to build its policy; each part is its own config section."""

    model: object  # poise.config.ModelConfig
    tokenizer: str
    algorithm: object  # poise.config.AlgorithmConfig
    rollout: object  # poise.rollout.engine.EngineConfig
    seed: int
    threads: int
    bitwise: bool
    device: str  # "cpu" | "cuda"
    emulated: object = None  # poise.runtime.emulated.EmulatedSpec: cluster.compute emulated, no model


class CommunicatorCache:
    """torch.distributed groups keyed by frozenset(ranks), each created once (DynaResize §3.2).

    `dist.new_group` is collective over the whole world: every worker must call `get` for the
    same rank sets in the same order, which `DeviceWorker.prewarm_groups` guarantees.
    """

    def __init__(self) -> None:
        self._groups: dict[frozenset[int], object] = {}

    def get(self, ranks: list[int] | tuple[int, ...]):
        import torch.distributed as dist

        key = frozenset(ranks)
        if key not in self._groups:
            self._groups[key] = dist.new_group(sorted(key))
        return self._groups[key]

    def __len__(self) -> int:
        return len(self._groups)


@ray.remote
class DeviceWorker:
    def __init__(self, rank: int, world_size: int, master_port: int, spec: WorkerSpec):
        self.emulated = None
        if spec.emulated is not None:  # compute replaced by cost-model sleeps (runtime/emulated.py)
            from poise.runtime.emulated import EmulatedDevice

            self.rank, self.world_size, self.spec = rank, world_size, spec
            self.emulated = EmulatedDevice(rank, spec.emulated, spec.rollout.num_slots)
            self.engine = self.emulated.engine
            self.role: Role = "idle"
            self.version = 0
            return
        import torch
        import torch.distributed as dist

        from poise.data.tokenizer import load_tokenizer
        from poise.rollout.engine import Engine
        from poise.train.setup import pin_threads
        from poise.train.trainer import PolicyTrainer

        self.rank, self.world_size, self.spec = rank, world_size, spec
        pin_threads(spec.threads, spec.bitwise)
        torch.manual_seed(spec.seed)  # the colocated loop's RNG state, saved in checkpoints
        self.device = torch.device("cuda", 0) if spec.device == "cuda" else torch.device("cpu")
        backend = "nccl" if spec.device == "cuda" else "gloo"
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{master_port}", rank=rank,
                                world_size=world_size)
        self.comm = CommunicatorCache()
        self.tokenizer = load_tokenizer(spec.tokenizer, spec.model.path)
        self.model = _initial_policy(spec, self.tokenizer).to(self.device)
        ref = None
        if spec.algorithm.kl_coef > 0:
            ref = _initial_policy(spec, self.tokenizer).to(self.device).requires_grad_(False).eval()
        self.trainer = PolicyTrainer(self.model, spec.algorithm, self.tokenizer.pad_id, ref)
        # Engine and trainer share the module tree: a train->rollout switch needs no weight copy.
        self.engine = Engine(self.model, spec.rollout, spec.algorithm.sampling, spec.seed, self.tokenizer.eos_id)
        self.role: Role = "idle"
        self.version = 0
        self._grads: dict[int, torch.Tensor] = {}  # micro-batch index -> flat gradient
        self._normaliser = 0.0
        self._stats: list[dict] = []

    # ---- role and communicators ---------------------------------------------------------------
    def set_role(self, role: Role) -> Role:
        self.role = role
        return role

    def prewarm_groups(self, rank_sets: list[list[int]]) -> int:
        """Create (collectively, in this order) every group the job may use; returns cache size."""
        if self.emulated is not None:  # no torch.distributed world: nothing to create
            return len(rank_sets)
        for ranks in rank_sets:
            self.comm.get(ranks)
        return len(self.comm)

    def weights_digest(self) -> str:
        import hashlib

        h = hashlib.sha256()
        for name, p in self.model.named_parameters():
            h.update(name.encode())
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()

    def state_dict_bytes(self) -> dict[str, bytes]:
        return {n: p.detach().cpu().contiguous().numpy().tobytes() for n, p in self.model.named_parameters()}

    # ---- rollout role -------------------------------------------------------------------------
    def submit(self, requests: list) -> int:
        for request in requests:
            self.engine.submit(request)
        return self.engine.num_running + self.engine.num_queued

    def poll(self, max_seconds: float = 0.02) -> tuple[list, int, float, float]:
        """Run engine steps until a sample finishes (or `max_seconds` pass); return the finished
        samples, how many are still in flight, and this poll's busy start/end (wall clock)."""
        start = time.time()
        finished: list = []
        while not self.engine.idle:
            finished.extend(self.engine.step())
            if finished and time.time() - start >= max_seconds:
                break
        return finished, self.engine.num_running + self.engine.num_queued, start, time.time()

    # ---- train role ---------------------------------------------------------------------------
    def train_micro_batch(self, index: int, samples: list, advantages: list[float]) -> dict:
        if self.emulated is not None:
            return self.emulated.trainer.train_micro_batch(index, samples, advantages)
        import torch

        start = time.time()
        result = self.trainer.micro_batch_grad(index, samples, torch.tensor(advantages, dtype=torch.float32))
        self._grads[index] = torch.cat([g.reshape(-1) for g in result.grads])
        self._normaliser += result.normaliser
        stats = {"index": index, "loss_sum": result.loss_sum, "normaliser": result.normaliser,
                 "clipped": result.clipped_tokens, "kl_sum": result.kl_sum, "tokens": result.tokens,
                 "start": start, "end": time.time(), "device": self.rank}
        return stats

    def apply_update(self, num_micro_batches: int, lo: int, hi: int, normaliser: float,
                     train_ranks: list[int]) -> dict:
        """Reduce the step's micro-batch gradients over the train ranks and take one optimizer step.

        bitwise: this rank's aligned tree nodes over [lo, hi) are all-gathered and combined in the
        fixed tree order; semantic: a local sum and an ordinary all-reduce.
        """
        if self.emulated is not None:
            return self.emulated.trainer.apply_update(num_micro_batches, lo, hi, normaliser, train_ranks)
        import torch
        import torch.distributed as dist

        from poise.train.reduce import aligned_nodes, combine, node_sum

        start = time.time()
        if set(self._grads) != set(range(lo, hi)):
            raise RuntimeError(f"device {self.rank}: expected micro-batches {lo}..{hi - 1}, "
                               f"got {sorted(self._grads)}")
        group = self.comm.get(train_ranks)
        numel = sum(p.numel() for p in self.trainer.params)
        add = torch.add
        if self.spec.bitwise:
            nodes = aligned_nodes(lo, hi, num_micro_batches) if hi > lo else []
            local = [node_sum(n, num_micro_batches, self._grads.__getitem__, add) for n in nodes]
            most = max(1, (num_micro_batches - 1).bit_length() * 2 + 2)
            buf = torch.zeros(most, numel + 2, dtype=torch.float32, device=self.device)
            buf[:, 0] = -1  # empty row marker
            for i, ((level, index), value) in enumerate(zip(nodes, local)):
                buf[i, 0], buf[i, 1], buf[i, 2:] = level, index, value
            gathered = [torch.empty_like(buf) for _ in train_ranks]
            dist.all_gather(gathered, buf, group=group)
            table = {(int(row[0]), int(row[1])): row[2:] for part in gathered for row in part if row[0] >= 0}
            total = combine(table, num_micro_batches, add)
        else:
            total = torch.zeros(numel, dtype=torch.float32, device=self.device)
            for index in sorted(self._grads):
                total += self._grads[index]
            dist.all_reduce(total, group=group)
        grads, offset = [], 0
        for p in self.trainer.params:
            grads.append(total[offset:offset + p.numel()].view_as(p).clone())
            offset += p.numel()
        norm = self.trainer.apply_update(grads, normaliser)
        self._grads.clear()
        self.version += 1
        return {"grad_norm": norm, "start": start, "end": time.time(), "device": self.rank}

    # ---- weight sync ------------------------------------------------------------------------
    def sync_weights(self, src: int, ranks: list[int], version: int, bucket_mb: float) -> float:
        """Bucketed broadcast from train rank `src` to every rank of `ranks` (cached group).

        Receivers load the buckets into their engine by name (`Engine.load_weights`), so the
        engine validates them and stamps `version` on every later sample.
        """
        if self.emulated is not None:
            self.version = version
            return self.emulated.trainer.sync_weights(src, version)
        import torch
        import torch.distributed as dist

        start = time.time()
        group = self.comm.get(ranks)
        names = [n for n, _ in self.model.named_parameters()]
        params = [p for _, p in self.model.named_parameters()]
        limit = max(1, int(bucket_mb * 2**20) // 4)
        received: list[tuple[str, torch.Tensor]] = []
        first = 0
        while first < len(params):
            last, size = first, 0
            while last < len(params) and (size == 0 or size + params[last].numel() <= limit):
                size += params[last].numel()
                last += 1
            if self.rank == src:
                flat = torch.cat([p.detach().reshape(-1) for p in params[first:last]])
            else:
                flat = torch.empty(size, dtype=params[first].dtype, device=self.device)
            dist.broadcast(flat, src=src, group=group)
            if self.rank != src:
                offset = 0
                for name, p in zip(names[first:last], params[first:last]):
                    received.append((name, flat[offset:offset + p.numel()].view_as(p)))
                    offset += p.numel()
            first = last
        if self.rank != src:
            self.engine.load_weights(received, version)
        else:
            self.engine.set_weights_version(version)  # the leader's engine shares its weights
        self.version = version
        return time.time() - start

    def save_checkpoint(self, run_dir: str, step: int, version: int) -> str:
        """Write the train replica's weights, optimizer and RNG (the colocated loop's format)."""
        if self.emulated is not None:  # an emulated device holds no weights
            return ""
        from poise.train.checkpoint import TrainState, save_checkpoint

        return str(save_checkpoint(run_dir, self.model, self.trainer.optimizer, TrainState(step, version)))

    def load_checkpoint(self, path: str) -> tuple[int, int]:
        """Restore weights, optimizer and RNG from a checkpoint; returns (step, weights version)."""
        from pathlib import Path

        from poise.train.checkpoint import load_checkpoint

        state = load_checkpoint(Path(path), self.model, self.trainer.optimizer)
        self.set_version(state.weights_version)
        return state.step, state.weights_version

    def set_version(self, version: int) -> None:
        self.version = version
        self.engine.set_weights_version(version)


def _initial_policy(spec: WorkerSpec, tokenizer):
    """Every device builds the same initial weights: a local checkpoint or the seeded tiny model."""
    from poise.model.loading import build_tiny, load_model

    if spec.model.path is not None:
        return load_model(spec.model.path)
    return build_tiny(spec.model.tiny, tokenizer.vocab_size, spec.seed, tokenizer.eos_id, tokenizer.pad_id,
                      tokenizer.bos_id)
