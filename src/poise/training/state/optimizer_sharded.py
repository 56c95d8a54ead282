"""`cluster.shard: optimizer`: each train device owns the AdamW state of one run of whole
parameters (placement.py). Its slice of the reduction is its run's gradient; it clips (the global
norm from every owner's per-tensor norms) and steps its run; the updated parameters return to
every device by all-gather. Checkpoints take every owner's part (checkpoint_stream.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from poise.training.checkpoint import TrainState, has_optimizer_state, load_checkpoint, save_checkpoint
from poise.training.state.checkpoint_stream import CheckpointStream
from poise.training.state.digest import weights_digest
from poise.training.state.exchange import HeldGradients
from poise.training.state.owned_optimizer import OwnedOptimizer
from poise.training.state.placement import WholeWeights, element_bounds, gather_runs, owner_runs
from poise.training.state.transfer import OwnedStateTransfers
from poise.training.trainer import param_views


HOLDS = "only its optimizer state is sharded (cluster.shard optimizer)"  # the mode's words in what it refuses


class OptimizerSharded:
    def __init__(self, trainer, comm, device: torch.device, rank: int, bitwise: bool) -> None:
        self.trainer, self.comm, self.device, self.rank, self.bitwise = trainer, comm, device, rank, bitwise
        self.sizes = [shape.numel() for shape in trainer.shapes]
        self.names = parameter_names(trainer)
        self.gradients = HeldGradients(rank, trainer.numel, device, bitwise, comm, HOLDS)
        self.owned = OwnedOptimizer(trainer, rank)
        self.optimizer_transfers = OwnedStateTransfers(rank, trainer, comm, device, self.owned, HOLDS)
        self.weights = WholeWeights(rank, HOLDS)
        self.stream = CheckpointStream(rank, trainer, self.names, comm, device)

    def update(self, m: int, indices: list[int], normaliser: float, ranks: list[int], rows: int
               ) -> tuple[float, dict]:
        """This owner's slice of the reduction, its clip and AdamW step, then every owner's updated
        run by all-gather."""
        ranks = sorted(ranks)
        group, me = self.comm.get(ranks), ranks.index(self.rank)
        runs = owner_runs(self.sizes, len(ranks))
        bounds = element_bounds(self.sizes, runs)
        first, end = runs[me]
        self.owned.check(first, end)
        part, received = self.gradients.reduce(m, indices, ranks, rows, bounds)
        if not self.bitwise:  # the all-reduced whole gradient: this owner's slice of it
            lo, hi = bounds[me]
            part, received = part[lo:hi], None
        norm, norm_bytes = self.owned.step_run(param_views(part, self.trainer.shapes[first:end]), normaliser, runs,
                                               me, group)
        gathered = gather_runs(self.trainer.params, bounds, me, group)
        if received is None:
            return norm, {}
        return norm, {"received_bytes": received + norm_bytes + gathered, "grad_bytes": 4 * self.trainer.numel}

    def save(self, run_dir: str, state: TrainState, extra: dict[str, bytes] | None, ranks: list[int] | None,
             parallel: bool) -> Path:
        return save_sharded(self.stream, run_dir, state, extra, ranks, parallel, None)

    def send_part(self, writer: int, ranks: list[int], parallel: bool) -> None:
        send_sharded_part(self.stream, writer, ranks, parallel, None)

    def load(self, path: str, train_ranks: list[int] | None) -> TrainState:
        self.trainer.optimizer.state.clear()
        state = load_checkpoint(Path(path), self.trainer.model, self.trainer.optimizer,
                                owned_names(self.names, self.sizes, self.rank, train_ranks), None)
        self.owned.stepped = has_optimizer_state(Path(path))
        return state

    def digest(self, before_collective: Callable[[], object]) -> str:
        return weights_digest(self.trainer.model)

    def drop_optimizer(self) -> None:
        self.trainer.optimizer.state.clear()


def parameter_names(trainer) -> list[str]:
    """The trained parameters' names, in the trainer's parameter order."""
    names = {p: n for n, p in trainer.model.named_parameters()}
    return [names[p] for p in trainer.params]


def owned_names(names: list[str], sizes: list[int], rank: int, train_ranks: list[int] | None) -> set[str] | None:
    """The parameters whose optimizer state device `rank` takes among `train_ranks`: its run (none
    off the trainer); None (no train group named): all of them."""
    if train_ranks is None:
        return None
    ranks = sorted(train_ranks)
    if rank not in ranks:
        return set()
    first, end = owner_runs(sizes, len(ranks))[ranks.index(rank)]
    return set(names[first:end])


def save_sharded(stream: CheckpointStream, run_dir: str, state: TrainState, extra: dict[str, bytes] | None,
                 ranks: list[int] | None, parallel: bool, weights) -> Path:
    """Write the weights, optimizer and RNG (the colocated loop's format); `ranks` are the train
    devices, every other one running `send_sharded_part` meanwhile. `parallel` (every train
    device sees `run_dir`): this device lays the files out and each owner writes its own tensors
    into them in place, at once; otherwise the owners' state streams into this device's files
    tensor by tensor, in file order, and with `weights` (`shard: full`, sharded now: its
    `ParameterShards`) the weights too, so no device holds more than its run and one tensor of
    another's."""
    trainer, rank = stream.trainer, stream.rank
    if parallel and ranks:
        listing = stream.listing(ranks)
        return save_checkpoint(run_dir, trainer.model, trainer.optimizer, state, extra,
                               owners_write=lambda tmp: stream.write_parts(ranks, rank, listing, tmp, weights))
    entries_of_weights = stream.weight_entries(rank, weights) if weights is not None and ranks else None
    entries = stream.state_entries(ranks, rank) if ranks else None
    return save_checkpoint(run_dir, trainer.model, trainer.optimizer, state, extra, entries, entries_of_weights)


def send_sharded_part(stream: CheckpointStream, writer: int, ranks: list[int], parallel: bool, weights) -> None:
    """This owner's part of the checkpoint train device `writer` writes: written into its files in
    place (`parallel`), or sent to it (with `weights` its weights first, then its optimizer state)."""
    if parallel:
        stream.write_parts(ranks, writer, stream.listing(ranks), None, weights)
        return
    stream.state_entries(ranks, writer, (lambda: stream.weight_entries(writer, weights)) if weights is not None
                         else None)
