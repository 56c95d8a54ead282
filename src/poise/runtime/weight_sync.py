"""The weight sync: the trained weights from the train devices to every rollout device, bucket by
bucket over cached communicators, loaded into each engine by name as they arrive. Replicated or
optimizer-sharded state: the train leader broadcasts; `shard: full`: every owner sends the
parameters it owns, point to point, and no device assembles the model to send it.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from poise.rollout.engine import EngineBusyError
from poise.runtime.communicators import CommunicatorCache
from poise.model.lora import trained_parameters
from poise.training.state import streams
from poise.training.state.placement import owner_of_each


class BroadcastSync:
    """Bucketed broadcast from train rank `src` to every rank of `ranks` over a cached group.

    Receivers load the buckets into their engine by name (`Engine.load_weights`), so the engine
    validates them and stamps `version` on every later sample.
    """

    def __init__(self, rank: int, model: torch.nn.Module, comm: CommunicatorCache, device: torch.device,
                 engine_call) -> None:
        self.rank, self.model, self.comm, self.device = rank, model, comm, device
        self.engine_call = engine_call  # runs fn(engine) with the engine loop paused

    def prewarm(self, rank_sets: list[list[int]]) -> int:
        """Create every group of `rank_sets` and run one tiny collective on each this rank belongs
        to: NCCL builds a communicator at its first collective, not at `new_group`, so without it
        the first use after a resize pays the set-up on the critical path. Every rank walks the same
        list in the same order, so the collectives cannot wait on each other in a cycle."""
        for ranks in rank_sets:
            group = self.comm.get(ranks)
            if self.rank in ranks:
                dist.all_reduce(torch.zeros(1, device=self.device), group=group)
                self.comm.warmed += 1
        streams.synchronize(self.device)
        self.comm.prewarmed()
        return len(self.comm)

    def groups_created_after_prewarm(self) -> int:
        return self.comm.created_after_prewarm

    def publish(self, src: int, ranks: list[int], version: int, bucket_mb: float,
                sender_ready: float | None = None, sources: list[int] | None = None) -> float:
        """`sources` (`shard: full`): the train devices, each of which sends the parameters it owns
        to every other rank of `ranks`, point to point; no device assembles the model to send it."""
        start = time.time()  # the broadcast itself waits for the sender: `sender_ready` is not needed
        if sources:
            self._publish_from_owners(sorted(sources), ranks, version, bucket_mb)
            streams.synchronize(self.device)
            return time.time() - start
        group = self.comm.get(ranks)
        if self.rank == src:  # the leader's engine shares its weights
            self._broadcast(src, group, bucket_mb)
            self.engine_call(lambda engine: engine.set_weights_version(version))
        else:
            self.engine_call(lambda engine: self._receive(engine, src, group, bucket_mb, version))
        streams.synchronize(self.device)  # a CUDA broadcast returns at enqueue: time the transfer itself
        return time.time() - start

    def _buckets(self, bucket_mb: float, owner: list[int] | None = None):
        """Consecutive runs of named parameters of at most `bucket_mb` (one parameter at least):
        what training changes (model/lora.py `trained_parameters`: the adapter alone under LoRA).
        `owner` (per parameter, its owner's rank): a bucket holds one owner's parameters alone."""
        named = trained_parameters(self.model)
        limit = max(1, int(bucket_mb * 2**20) // 4)
        first = 0
        while first < len(named):
            last, size = first, 0
            while last < len(named) and (size == 0 or size + named[last][1].numel() <= limit) and (
                    owner is None or owner[last] == owner[first]):
                size += named[last][1].numel()
                last += 1
            yield named[first:last], size
            first = last

    def _owners(self, sources: list[int]) -> list[int]:
        """Per trained parameter, the train device that owns it (training/state/placement.py)."""
        return owner_of_each([p.numel() for _, p in trained_parameters(self.model)], sources)

    @torch.no_grad()
    def _publish_from_owners(self, sources: list[int], ranks: list[int], version: int, bucket_mb: float) -> None:
        owner = self._owners(sources)
        if self.rank not in sources:
            self.engine_call(lambda engine: self._receive(engine, None, None, bucket_mb, version, owner))
            return
        receivers = [r for r in ranks if r not in sources]
        at = 0
        for bucket, _ in self._buckets(bucket_mb, owner):
            mine, at = owner[at] == self.rank, at + len(bucket)
            if mine:  # one bucket in flight at a time, to every receiver (the default group: any pair)
                flat = torch.cat([p.detach().reshape(-1) for _, p in bucket])
                for work in [self.comm.transport.isend(flat, r) for r in receivers]:
                    work.wait()
                del flat
        self.engine_call(lambda engine: engine.set_weights_version(version))

    def _broadcast(self, src: int, group, bucket_mb: float) -> None:
        for bucket, _ in self._buckets(bucket_mb):
            flat = torch.cat([p.detach().reshape(-1) for _, p in bucket])
            dist.broadcast(flat, src=src, group=group)

    @torch.no_grad()
    def _receive(self, engine, src: int | None, group, bucket_mb: float, version: int,
                 owner: list[int] | None = None) -> None:
        """Receive each bucket and copy it into the engine's weights (this device's model) at once,
        so at most one bucket is held beside the model, never a second copy of it. Runs with the
        engine loop paused; the engine's in-flight check comes first, and a refused device still
        takes part in every broadcast (the sender would otherwise wait out the collective timeout)."""
        try:
            engine.set_weights_version(version)  # raises, touching nothing, if sequences are in flight
            refused = None
        except EngineBusyError as e:  # re-raised once the collective is done
            refused = e
        at = 0
        for bucket, size in self._buckets(bucket_mb, owner):
            flat = torch.empty(size, dtype=bucket[0][1].dtype, device=self.device)
            if owner is None:
                dist.broadcast(flat, src=src, group=group)
            else:  # shard: full: from the bucket's owner
                self.comm.transport.recv(flat, owner[at])
            at += len(bucket)
            if refused is None:
                offset = 0
                for _, p in bucket:
                    p.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
            del flat  # before the next bucket is allocated
        if refused is not None:
            raise refused
