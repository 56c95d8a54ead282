"""The real train role: a torch train shard, the actor-side half of training. It computes each
canonical micro-batch it is given, keeps the step's bookkeeping (which micro-batches it computed,
how long an update waited for a transfer), runs a live resize's optimizer transfer on a thread of
its own, and hands everything about how the weights, gradients and AdamW state are held to its
state: one `StateStrategy` per `cluster.shard` mode (poise.training.state), chosen once, never
asked which it is. Imported only by a worker with real compute.
"""

from __future__ import annotations

import time

import torch

from poise.runtime.communicators import CommunicatorCache
from poise.runtime.roles import BackgroundTask
from poise.training.state import strategy_for
from poise.training.state.protocol import Transfer
from poise.training.checkpoint import TrainState
from poise.training.trainer import PolicyTrainer
from poise.types import Sample


class TorchTrainShard:
    """`shard`: `none`, `optimizer` or `full` (poise.training.state: replicated, optimizer-sharded
    or fully sharded state; under `full` micro-batches run in lockstep rounds, `train_round`)."""

    def __init__(self, rank: int, trainer: PolicyTrainer, comm: CommunicatorCache, bitwise: bool,
                 device: torch.device, on_version, shard: str = "none") -> None:
        self.rank, self.trainer, self.comm, self.device = rank, trainer, comm, device
        self.on_version = on_version  # the worker stamps restored versions on its engine
        self.state = strategy_for(shard, trainer, comm, device, rank, bitwise)
        self._held: set[int] = set()  # the micro-batches this device computed in the current mini-batch
        self._transfer: _InBackground | None = None  # a live resize's optimizer transfer in flight
        self._barrier_s = 0.0  # seconds this update's rounds waited for it (shard: full)

    def train_micro_batch(self, index: int, samples, advantages) -> dict:
        start = time.time()
        result = self.trainer.micro_batch_grad(index, samples, torch.tensor(advantages, dtype=torch.float32))
        flat, result.flat_grad = result.flat_grad, torch.empty(0)
        if index in self._held:
            raise RuntimeError(f"device {self.rank}: micro-batch {index} computed twice in one update")
        self._held.add(index)
        return self._record(result, start, self.state.gradients.keep_gradient(index, flat))

    def _record(self, result, start: float, held_grads: int) -> dict:
        """What the driver logs of one micro-batch (its stats, its interval, the gradients held)."""
        return {"index": result.index, "loss_sum": result.loss_sum, "normaliser": result.normaliser,
                "clipped": result.clipped_tokens, "kl_sum": result.kl_sum, "tokens": result.tokens,
                "entropy_sum": result.entropy_sum, "mismatch": result.mismatch,  # ~200 ints of histogram at most
                "clipped_responses": result.clipped_responses, "responses": result.responses,
                "start": start, "end": time.time(), "device": self.rank, "held_grads": held_grads}

    def train_round(self, index: int | None, samples, advantages, ranks: list[int]) -> dict | None:
        """`shard: full`: this device's micro-batch of a lockstep round over train devices `ranks`
        (None: it has none left in this mini-batch, and runs the stand-in with the others)."""
        start = time.time()
        if index is not None and index in self._held:
            raise RuntimeError(f"device {self.rank}: micro-batch {index} computed twice in one update")
        # a resize's optimizer reshard runs its transfers on a thread of its own over another
        # communicator: the round's collectives wait for it, so two communicators never run at once
        # (NCCL can hang when two threads use two communicators in an order the ranks do not share)
        self._barrier_s += self.wait_optimizer_transfer()
        consumer = self.state.gradients.begin_round(ranks, index)
        try:
            if index is None:
                samples, advantages = stand_in(self.trainer.pad_id), [0.0]
            result = self.trainer.micro_batch_grad(-1 if index is None else index, samples,
                                                   torch.tensor(advantages, dtype=torch.float32), consumer)
        finally:
            self.state.gradients.end_round()
        if index is None:
            return None
        self._held.add(index)
        return self._record(result, start, 0)  # each gradient went to its owner

    def apply_update(self, num_micro_batches: int, indices: list[int], normaliser: float, ranks: list[int],
                     rows: int, inputs_ready: float | None = None) -> dict:
        """Reduce the mini-batch's micro-batch gradients over `ranks` and take one step.

        `indices`: the micro-batches this device computed; `ranks`: every device holding some (the
        train devices, and with `pipeline.assist` the rollout devices that `contribute`). `rows`:
        the most tree nodes any of `ranks` holds (the size of the node names each rank sends).
        """
        start = time.time()
        barrier_s = self._barrier_s + self.wait_optimizer_transfer()  # the optimizer state must be whole first
        self._barrier_s = 0.0
        self._take_held(indices)
        norm, traffic = self.state.update(num_micro_batches, indices, normaliser, ranks, rows)
        traffic["optimizer_bytes"] = sum(t.numel() * t.element_size() for st in self.trainer.optimizer.state.values()
                                         for t in st.values() if torch.is_tensor(t))
        traffic["parameter_bytes"] = sum(p.untyped_storage().nbytes() for p in self.trainer.params)  # held here
        return {"grad_norm": norm, "start": start, "end": time.time(), "device": self.rank, "barrier_s": barrier_s,
                **traffic}

    def contribute(self, num_micro_batches: int, indices: list[int], ranks: list[int], rows: int) -> dict:
        """`pipeline.assist`: a rollout device's part of the reduction (the gradients of `indices`,
        computed with the weights the train devices hold before their step); it takes no step."""
        start = time.time()
        self._take_held(indices)
        self.state.gradients.contribute(num_micro_batches, indices, ranks, rows)
        return {"start": start, "end": time.time(), "device": self.rank}

    def _take_held(self, indices: list[int]) -> None:
        """The mini-batch's micro-batches computed here must be exactly `indices`; a new mini-batch
        starts."""
        if self._held != set(indices):
            raise RuntimeError(f"device {self.rank}: expected micro-batches {sorted(indices)}, "
                               f"got {sorted(self._held)}")
        self._held = set()

    # ---- live resize ------------------------------------------------------------------------
    def gather_weights(self, new_ranks: list[int]) -> tuple[int, int]:
        """Before a live resize (collective over the old train group where the weights are sharded):
        what each device holds of the weights after it. Returns the most weight bytes it held at
        once and the weight bytes it received."""
        self.wait_optimizer_transfer()  # its collectives never beside a transfer still on its own thread
        return self.state.weights.reshard(new_ranks)

    def shard_weights(self, ranks: list[int]) -> None:
        """A device joining the trainer (it holds the whole model, as a rollout device) keeps what
        it holds among train devices `ranks`; no collective."""
        self.state.weights.shard_over(ranks)

    def adopt(self, ranks: list[int]) -> None:
        """The model was loaded with this device's part among train devices `ranks` alone."""
        self.state.weights.adopt(ranks)

    def transfer_optimizer(self, src: int, ranks: list[int], buffer_bytes: int) -> None:
        """Start sending (rank == src) or receiving the whole optimizer state over the cached group
        of `ranks`, in the background; the next update or checkpoint waits for it."""
        self.wait_optimizer_transfer()
        self._transfer = _InBackground(self.state.optimizer_transfers.copy(src, ranks, buffer_bytes),
                                       f"device {self.rank}: optimizer transfer from device {src}")

    def reshard_optimizer(self, old_ranks: list[int], new_ranks: list[int], buffer_bytes: int) -> None:
        """Sharded live resize: hand the state of every parameter whose owner changes from its
        owner among `old_ranks` to its owner among `new_ranks`, in the background (DynaResize's
        optimizer migration through a bounded buffer); the next update or checkpoint waits for it."""
        self.wait_optimizer_transfer()
        self._transfer = _InBackground(self.state.optimizer_transfers.reshard(old_ranks, new_ranks, buffer_bytes),
                                       f"device {self.rank}: optimizer reshard {sorted(old_ranks)} -> "
                                       f"{sorted(new_ranks)}")

    def wait_optimizer_transfer(self) -> float:
        """Block until an optimizer transfer is done (the explicit barrier); returns seconds waited."""
        return self._transfer.task.join() if self._transfer is not None else 0.0

    def optimizer_transfer_report(self) -> dict:
        """What the last optimizer transfer moved (bytes, seconds, peak host buffer); empty if none."""
        return self._transfer.report if self._transfer is not None else {}

    def drop_optimizer(self) -> None:
        """Leaving the trainer: free the optimizer state (a peer re-sends it if this device returns)
        and the reference model (rebuilt if it trains again)."""
        self.wait_optimizer_transfer()
        self.state.drop_optimizer()
        self.trainer.release_reference()

    # ---- checkpoints --------------------------------------------------------------------------
    def save_checkpoint(self, run_dir: str, step: int, version: int, extra: dict[str, bytes] | None = None,
                        ranks: list[int] | None = None, parallel: bool = False) -> str:
        """Write the weights, optimizer and RNG (the colocated loop's format). Sharded, `ranks`
        are the train devices: every other one runs `send_optimizer_state` meanwhile; `parallel`:
        every train device sees `run_dir` and writes its own part in place."""
        self.wait_optimizer_transfer()
        return str(self.state.save(run_dir, TrainState(step, version), extra, ranks, parallel))

    def send_optimizer_state(self, writer: int, ranks: list[int], parallel: bool = False) -> None:
        """Sharded: this owner's part of the checkpoint train device `writer` writes: written into
        its files in place (`parallel`), or sent to it (under `shard: full` its weights first,
        then its optimizer state)."""
        self.wait_optimizer_transfer()
        self.state.send_part(writer, ranks, parallel)

    def load_checkpoint(self, path: str, train_ranks: list[int] | None = None) -> tuple[int, int]:
        """`train_ranks`: the train devices the run goes on with. A device among them takes the
        optimizer state of what it owns (all of it unsharded), any other device none; default:
        all of it."""
        state = self.state.load(path, train_ranks)
        self.on_version(state.weights_version)
        return state.step, state.weights_version

    def digest(self) -> str | None:
        """The weights' digest; where the weights are sharded, collective over the train group and
        the group's first device returns it (the others None)."""
        # a collective digest never runs beside a transfer still on its own thread
        return self.state.digest(before_collective=self.wait_optimizer_transfer)


def stand_in(pad_id: int) -> list[Sample]:
    """The one-token sample a device with no micro-batch in a round trains on (its owners drop it)."""
    return [Sample((0, 0, 0), (pad_id,), (pad_id,), (0.0,), "length", 0, 0.0, 0.0, 1)]


class _InBackground:
    """An optimizer transfer's `run` on a thread of its own (`BackgroundTask`), and its report."""

    def __init__(self, transfer: Transfer, name: str) -> None:
        self.transfer = transfer
        self.task = BackgroundTask(transfer.run, name)

    @property
    def report(self) -> dict:
        return self.transfer.report
