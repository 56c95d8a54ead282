"""Training state as strategies: how a train device holds and updates its weights, gradients and
AdamW state (`cluster.shard`), applied to a model built whole (docs/design.md, "Scale").

    protocol.py           the one protocol (`StateStrategy`) the runtime's train shard calls, and the
                          parts each strategy composes (gradient exchange, optimizer transfers,
                          weight placement)
    replicated.py         none: every train device holds everything
    optimizer_sharded.py  optimizer: each owns the AdamW state of a run of parameters
    fully_sharded.py      full: the parameters too (parameter_shards.py), micro-batches in rounds
    placement.py          who owns what; the all-gathers of owned runs; whole weights on every device
    exchange.py           the fixed-order gradient exchange of the first two
    owned_optimizer.py    an owner's AdamW state: its check and its step
    transfer.py           a live resize's optimizer transfers through a bounded buffer, and which a
                          state makes
    checkpoint_stream.py  a sharded checkpoint's parts, streamed to the writer or written in place
    streams.py, digest.py the side stream and device synchronisation; the weights' digest

torch.distributed only: threads, actors and the communicator cache are the runtime's.
"""

from __future__ import annotations

import torch

from poise.training.state.fully_sharded import FullySharded
from poise.training.state.optimizer_sharded import OptimizerSharded
from poise.training.state.protocol import Communicators, StateStrategy
from poise.training.state.replicated import Replicated

MODES = ("none", "optimizer", "full")


def strategy_for(shard: str, trainer, comm: Communicators, device: torch.device, rank: int,
                 bitwise: bool) -> StateStrategy:
    """The state of `trainer` on train device `rank` under `cluster.shard: shard` (the one place the
    mode is read)."""
    if shard == "none":
        return Replicated(trainer, comm, device, rank, bitwise)
    if shard == "optimizer":
        return OptimizerSharded(trainer, comm, device, rank, bitwise)
    if shard == "full":
        return FullySharded(trainer, comm, device, rank, bitwise)
    raise ValueError(f"cluster.shard={shard!r}: expected one of {', '.join(MODES)}")
