"""How a train device holds and updates its training state: one protocol, one implementation per
`cluster.shard` mode (replicated.py, optimizer_sharded.py, fully_sharded.py), chosen once by
`poise.training.state.strategy_for`. The runtime's train shard holds one and never asks which.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

import torch

from poise.training.checkpoint import TrainState
from poise.training.trainer import GradientConsumer


class Communicators(Protocol):
    """What a state needs of the runtime's communicator cache: a group per set of ranks (created
    collectively, once) and the point-to-point transport of its device (send, recv, isend, irecv
    with torch.distributed's meaning)."""

    transport: object

    def get(self, ranks: list[int] | tuple[int, ...]) -> object: ...


class Transfer(Protocol):
    """A live resize's optimizer transfer (transfer.py): `run()` moves the state (the runtime runs
    it on a thread of its own); `report` says what it moved once it ran."""

    report: dict

    def run(self) -> None: ...


class GradientExchange(Protocol):
    """How a train device's micro-batch gradients reach the reduction: held here until the update
    (`none`, `optimizer`: exchange.py's `HeldGradients`), or sent to their owners during lockstep
    rounds (`full`: `ParameterShards`)."""

    def keep_gradient(self, index: int, flat: torch.Tensor) -> int:
        """Fold micro-batch `index`'s flat gradient into what this device holds; returns the
        gradients (tree nodes) held. Refused where micro-batches run in rounds."""
        ...

    def begin_round(self, ranks: list[int], index: int | None) -> GradientConsumer:
        """A lockstep round over train devices `ranks` (this device's micro-batch `index`, None
        for a stand-in); returns what takes the round's gradients. Refused where there are none."""
        ...

    def end_round(self) -> None: ...

    def contribute(self, m: int, indices: list[int], ranks: list[int], rows: int) -> None:
        """`pipeline.assist`: a rollout device's part of the reduction; no step. Refused where
        gradients go to their owners during the rounds."""
        ...


def refused(rank: int, asked: str, holds: str, instead: str) -> RuntimeError:
    """The error of a call a mode does not serve (a runtime bug, never the user's): what device `rank`
    was `asked`, how its state `holds` (the mode's words), what serves `instead`."""
    return RuntimeError(f"device {rank}: {asked}, but {holds}: {instead}")


class OptimizerTransfers(Protocol):
    """How the optimizer state moves on a live resize: copied whole to the joiners (`none`:
    transfer.py `WholeStateTransfers`), or handed between owners (`optimizer`, `full`:
    `OwnedStateTransfers`). Each refuses the other."""

    def copy(self, src: int, ranks: list[int], buffer_bytes: int) -> Transfer:
        """Replicated state: the whole optimizer state from `src` to the other `ranks`."""
        ...

    def reshard(self, old_ranks: list[int], new_ranks: list[int], buffer_bytes: int) -> Transfer:
        """Sharded state: each parameter's state from its owner among `old_ranks` to its owner among
        `new_ranks`."""
        ...


class WeightPlacement(Protocol):
    """Where the weights sit around a live resize: whole on every device (`none`, `optimizer`:
    placement.py `WholeWeights`), or each train device's run alone (`full`: `ParameterShards`)."""

    def reshard(self, new_ranks: list[int]) -> tuple[int, int]:
        """Before a resize (collective over the old train group): the weights a device needs after
        it; returns the most weight bytes held at once and the weight bytes received."""
        ...

    def shard_over(self, ranks: list[int]) -> None:
        """A device joining the trainer keeps the weights it holds there among `ranks`."""
        ...

    def adopt(self, ranks: list[int]) -> None:
        """The model was loaded with this device's part among `ranks` alone."""
        ...


class StateStrategy(Protocol):
    # ---- gradients and the update --------------------------------------------------------------
    gradients: GradientExchange

    def update(self, m: int, indices: list[int], normaliser: float, ranks: list[int], rows: int
               ) -> tuple[float, dict]:
        """Reduce the mini-batch's m micro-batch gradients (`indices` computed here) over `ranks`
        and step; returns the gradient norm and the traffic (bytes received, of what)."""
        ...

    # ---- checkpoints ------------------------------------------------------------------------
    def save(self, run_dir: str, state: TrainState, extra: dict[str, bytes] | None, ranks: list[int] | None,
             parallel: bool) -> Path:
        """Write the checkpoint; `ranks`: the train devices, each running `send_part` meanwhile."""
        ...

    def send_part(self, writer: int, ranks: list[int], parallel: bool) -> None:
        """This owner's part of the checkpoint train device `writer` writes."""
        ...

    def load(self, path: str, train_ranks: list[int] | None) -> TrainState:
        """Read the weights and the optimizer state this device holds among `train_ranks`."""
        ...

    def digest(self, before_collective: Callable[[], object]) -> str | None:
        """The weights' digest (None on the devices of a collective digest that do not compute it);
        `before_collective()` runs first where the digest is a collective."""
        ...

    # ---- a live resize ------------------------------------------------------------------------
    optimizer_transfers: OptimizerTransfers
    weights: WeightPlacement

    def drop_optimizer(self) -> None:
        """Leaving the trainer: free the optimizer state."""
        ...
