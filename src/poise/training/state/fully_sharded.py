"""`cluster.shard: full`: the parameters are sharded too, not only their AdamW state
(parameter_shards.py). Micro-batches run in lockstep rounds, each parameter's gradient goes to its
owner during the backward, and an owner clips and steps its run as `optimizer` does; the updated
parameters stay with their owners. A resize gathers and re-shards the weights, a checkpoint
streams them from their owners, and a digest is collective.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from poise.training.checkpoint import TrainState, has_optimizer_state, load_checkpoint
from poise.training.state.checkpoint_stream import CheckpointStream
from poise.training.state.digest import weights_digest
from poise.training.state.optimizer_sharded import owned_names, parameter_names, save_sharded, send_sharded_part
from poise.training.state.owned_optimizer import OwnedOptimizer
from poise.training.state.parameter_shards import ParameterShards
from poise.training.state.placement import owner_runs
from poise.training.state.protocol import refused
from poise.training.state.transfer import OwnedStateTransfers
from poise.training.trainer import GradientConsumer


HOLDS = "its parameters are sharded (cluster.shard full)"  # the mode's words in what it refuses


class FullySharded:
    def __init__(self, trainer, comm, device: torch.device, rank: int, bitwise: bool) -> None:
        self.trainer, self.comm, self.device, self.rank = trainer, comm, device, rank
        self.sizes = [shape.numel() for shape in trainer.shapes]
        self.names = parameter_names(trainer)
        self.shards = ParameterShards(trainer, comm, device, rank, bitwise)
        self.gradients = LockstepRounds(self.shards, rank)
        self.owned = OwnedOptimizer(trainer, rank)
        self.optimizer_transfers = OwnedStateTransfers(rank, trainer, comm, device, self.owned, HOLDS)
        self.weights = self.shards
        self.stream = CheckpointStream(rank, trainer, self.names, comm, device)

    def _sharded(self) -> ParameterShards | None:
        """The parameter shards while the weights are sharded over a train group; None while every
        weight is held here."""
        return self.shards if self.shards.ranks is not None else None

    def update(self, m: int, indices: list[int], normaliser: float, ranks: list[int], rows: int
               ) -> tuple[float, dict]:
        """The owner's gradients already sit in its trees (sent during the rounds): clip and step its
        run as `optimizer` does. The parameters stay with their owners."""
        gathered = self.shards.weight_bytes  # the weights the rounds gathered
        ranks = sorted(ranks)
        self.shards.shard_over(ranks)  # a mini-batch of this device's micro-batches alone has had no round
        group, me = self.comm.get(ranks), ranks.index(self.rank)
        runs = owner_runs(self.sizes, len(ranks))
        first, end = runs[me]
        self.owned.check(first, end)
        norm, norm_bytes = self.owned.step_run(self.shards.summed(m, first, end), normaliser, runs, me, group)
        # the gradients and norms it received, and the weights the rounds gathered (the price of sharding them)
        received = self.shards.received + norm_bytes + self.shards.weight_bytes
        self.shards.received = self.shards.weight_bytes = 0
        return norm, {"received_bytes": received, "grad_bytes": 4 * self.trainer.numel, "weight_bytes": gathered}

    def save(self, run_dir: str, state: TrainState, extra: dict[str, bytes] | None, ranks: list[int] | None,
             parallel: bool) -> Path:
        return save_sharded(self.stream, run_dir, state, extra, ranks, parallel, self._sharded())

    def send_part(self, writer: int, ranks: list[int], parallel: bool) -> None:
        send_sharded_part(self.stream, writer, ranks, parallel, self._sharded())

    def load(self, path: str, train_ranks: list[int] | None) -> TrainState:
        """A train device reads its own run of the weights alone; a rollout device (or no train
        group named) the whole model."""
        self.trainer.optimizer.state.clear()
        weights = None
        if train_ranks is not None and self.rank in train_ranks:
            self.shards.hold_run(train_ranks)
            weights = {self.names[i] for i in range(len(self.names)) if self.shards.owns(i)}
        else:
            self.shards.hold_all()
        state = load_checkpoint(Path(path), self.trainer.model, self.trainer.optimizer,
                                owned_names(self.names, self.sizes, self.rank, train_ranks), weights)
        self.owned.stepped = has_optimizer_state(Path(path))
        return state

    def digest(self, before_collective: Callable[[], object]) -> str | None:
        """While sharded: collective over the train group, the group's first device returns it."""
        if self._sharded() is not None:
            before_collective()
            return self.shards.digest(self.names)
        return weights_digest(self.trainer.model)

    def drop_optimizer(self) -> None:
        if self._sharded() is not None:
            raise RuntimeError(f"device {self.rank} leaves the trainer holding only its shard of the weights; "
                               "gather_weights must run on every train device first")
        self.trainer.optimizer.state.clear()


class LockstepRounds:
    """The gradient exchange (protocol.py `GradientExchange`) of sharded parameters: every
    micro-batch runs in a lockstep round, and each gradient goes to its owner during the backward."""

    def __init__(self, shards: ParameterShards, rank: int) -> None:
        self.shards, self.rank = shards, rank

    def keep_gradient(self, index: int, flat: torch.Tensor) -> int:
        raise refused(self.rank, "a micro-batch outside a round", HOLDS, "every micro-batch runs in a lockstep round")

    def begin_round(self, ranks: list[int], index: int | None) -> GradientConsumer:
        self.shards.begin_round(ranks, index)
        return self.shards

    def end_round(self) -> None:
        self.shards.end_round()

    def contribute(self, m: int, indices: list[int], ranks: list[int], rows: int) -> None:
        raise refused(self.rank, "a rollout device's part of a reduction", HOLDS,
                      "gradients go to their owners during the rounds")
