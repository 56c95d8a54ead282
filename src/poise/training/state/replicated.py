"""`cluster.shard: none`: every train device holds the whole model and the whole AdamW state; the
reduction all-gathers the summed gradient to every device, and every device takes the same step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from poise.training.checkpoint import TrainState, load_checkpoint, save_checkpoint
from poise.training.state.digest import weights_digest
from poise.training.state.exchange import HeldGradients
from poise.training.state.placement import WholeWeights
from poise.training.state.protocol import refused
from poise.training.state.transfer import WholeStateTransfers
from poise.training.trainer import param_views


HOLDS = "its state is replicated (cluster.shard none)"  # the mode's words in what it refuses


class Replicated:
    def __init__(self, trainer, comm, device: torch.device, rank: int, bitwise: bool) -> None:
        self.trainer, self.comm, self.device, self.rank = trainer, comm, device, rank
        self.gradients = HeldGradients(rank, trainer.numel, device, bitwise, comm, HOLDS)
        self.optimizer_transfers = WholeStateTransfers(rank, trainer, comm, device, HOLDS)
        self.weights = WholeWeights(rank, HOLDS)

    def update(self, m: int, indices: list[int], normaliser: float, ranks: list[int], rows: int
               ) -> tuple[float, dict]:
        total, received = self.gradients.reduce(m, indices, ranks, rows)
        norm = self.trainer.apply_update(param_views(total, self.trainer.shapes), normaliser)
        return norm, {} if received is None else {"received_bytes": received, "grad_bytes": 4 * self.trainer.numel}

    def save(self, run_dir: str, state: TrainState, extra: dict[str, bytes] | None, ranks: list[int] | None,
             parallel: bool) -> Path:
        return save_checkpoint(run_dir, self.trainer.model, self.trainer.optimizer, state, extra, None, None)

    def send_part(self, writer: int, ranks: list[int], parallel: bool) -> None:
        raise refused(self.rank, "asked for its part of a checkpoint", HOLDS, f"device {writer} holds all of it")

    def load(self, path: str, train_ranks: list[int] | None) -> TrainState:
        """A train device takes the whole optimizer state, any other device none (default: all)."""
        owned = None
        if train_ranks is not None:
            owned = {n for n, p in self.trainer.model.named_parameters() if p.requires_grad} \
                if self.rank in train_ranks else set()
        self.trainer.optimizer.state.clear()
        return load_checkpoint(Path(path), self.trainer.model, self.trainer.optimizer, owned, None)

    def digest(self, before_collective: Callable[[], object]) -> str:
        return weights_digest(self.trainer.model)

    def drop_optimizer(self) -> None:
        self.trainer.optimizer.state.clear()
