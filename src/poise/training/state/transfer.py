"""A live resize's optimizer transfers (DynaResize §3.3): the AdamW state flows through one bounded
buffer, chunk by chunk. Each transfer is a `run()` and a `report`; the runtime runs it on a thread
of its own while the joiner runs its first forward/backward, and the next optimizer step waits
for it (so the update is exact: the state is a bitwise copy).

`OptimizerTransfer`: replicated state, every tensor from one train device to the joiners, by
broadcast. `OptimizerReshard`: sharded state, each parameter whose owner changes from its old owner
to its new one, point to point. `WholeStateTransfers` and `OwnedStateTransfers`: which of the two a
state makes (protocol.py `OptimizerTransfers`); `holds`: the state's words for how it holds its
optimizer state, for the one it refuses.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from poise.training.state import streams
from poise.training.state.placement import owner_of_each
from poise.training.state.protocol import refused


class WholeStateTransfers:
    """Replicated state: a joiner copies the whole of it; nothing reshards."""

    def __init__(self, rank: int, trainer, comm, device: torch.device, holds: str):
        self.rank, self.trainer, self.comm, self.device, self.holds = rank, trainer, comm, device, holds

    def copy(self, src: int, ranks: list[int], buffer_bytes: int) -> OptimizerTransfer:
        return OptimizerTransfer(self.rank, src, self.comm.get(ranks), self.trainer, buffer_bytes, self.device)

    def reshard(self, old_ranks: list[int], new_ranks: list[int], buffer_bytes: int) -> OptimizerReshard:
        raise refused(self.rank, "an optimizer reshard", self.holds, "a joining device copies the whole state")


class OwnedStateTransfers:
    """Sharded state (`owned`: this device's `OwnedOptimizer`): each owner's state reshards; no
    device copies the whole of it."""

    def __init__(self, rank: int, trainer, comm, device: torch.device, owned, holds: str):
        self.rank, self.trainer, self.comm, self.device, self.owned = rank, trainer, comm, device, owned
        self.holds = holds

    def copy(self, src: int, ranks: list[int], buffer_bytes: int) -> OptimizerTransfer:
        raise refused(self.rank, "a copy of the whole optimizer state", self.holds, "a resize reshards it")

    def reshard(self, old_ranks: list[int], new_ranks: list[int], buffer_bytes: int) -> OptimizerReshard:
        return OptimizerReshard(self.rank, self.trainer, self.comm, self.device, self.owned, sorted(old_ranks),
                                sorted(new_ranks), buffer_bytes)


class OptimizerTransfer:
    """From train rank `src` to the other ranks of `group`: the AdamW state of every parameter, in
    parameter order (step, exp_avg, exp_avg_sq), through a buffer of `buffer_bytes`, by broadcast."""

    def __init__(self, rank: int, src: int, group, trainer, buffer_bytes: int, device: torch.device):
        self.rank, self.src, self.group, self.trainer, self.device = rank, src, group, trainer, device
        self.buffer_bytes = buffer_bytes
        self.report: dict = {}

    def _views(self) -> list[torch.Tensor]:
        """The state as flat float32 views, in the one canonical order both sides agree on."""
        opt = self.trainer.optimizer
        views = []
        for p in self.trainer.params:
            if self.rank != self.src:  # the receiver writes straight into fresh state tensors
                opt.state[p] = self.trainer.fresh_state(p)
            st = opt.state[p]
            views += [st["step"].view(1)] + [st[key].view(-1) for key in self.trainer.state_fields()]
        return views

    def run(self) -> None:
        t0 = time.time()
        opt, sending = self.trainer.optimizer, self.rank == self.src
        has = torch.tensor([1.0 if sending and opt.state else 0.0], device=self.device)
        dist.broadcast(has, src=self.src, group=self.group)  # before the first update there is none
        if not has.item():
            opt.state.clear()
            self.report = {"bytes": 0, "seconds": time.time() - t0, "peak_buffer_bytes": 0}
            return
        # the state is allocated on the training stream (it lives on there); only the chunk copies
        # run on the transfer's own stream, so they overlap the joiner's first forward/backward
        views = self._views()
        total = sum(v.numel() for v in views)
        with streams.side_stream(self.device):
            buf = torch.empty(min(total, max(1, self.buffer_bytes // 4)), dtype=torch.float32, device=self.device)
            cursor = (0, 0)  # (view, offset in it)
            moved = 0
            while moved < total:
                n = min(buf.numel(), total - moved)
                if sending:
                    cursor = _copy_chunk(views, cursor, buf[:n], into_buffer=True)
                dist.broadcast(buf[:n], src=self.src, group=self.group)
                if not sending:
                    cursor = _copy_chunk(views, cursor, buf[:n], into_buffer=False)
                moved += n
            streams.synchronize(self.device)  # the time of the transfer, not of its enqueue; the step reads it next
        self.report = {"bytes": 4 * total, "seconds": time.time() - t0, "peak_buffer_bytes": 4 * buf.numel()}


def _copy_chunk(views: list[torch.Tensor], cursor: tuple[int, int], buf: torch.Tensor, into_buffer: bool
                ) -> tuple[int, int]:
    """Copy len(buf) elements between the views, from `cursor` on, and the buffer; returns where
    the next chunk starts."""
    filled = 0
    vi, off = cursor
    while filled < buf.numel():
        v = views[vi]
        n = min(v.numel() - off, buf.numel() - filled)
        if into_buffer:
            buf[filled:filled + n].copy_(v[off:off + n])
        else:
            v[off:off + n].copy_(buf[filled:filled + n])
        filled += n
        vi, off = (vi + 1, 0) if off + n == v.numel() else (vi, off + n)
    return vi, off


class OptimizerReshard:
    """The state of each parameter whose owner changes, sent by its old owner to its new one point to
    point over the larger of the two train groups (a prewarmed one: train groups are suffixes of the
    devices, so it holds both), in parameter order on every device (so each pair's sends and
    receives meet in order), chunk by chunk through one buffer of `buffer_bytes`. A sender frees
    what it sent; a receiver allocates what it receives. The parameter's `step` goes first, -1
    when no update has happened yet (nothing more follows). `owned`: this device's
    `OwnedOptimizer` (whether any update happened)."""

    def __init__(self, rank: int, trainer, comm, device: torch.device, owned, old: list[int], new: list[int],
                 buffer_bytes: int):
        self.rank, self.trainer, self.comm, self.device, self.owned = rank, trainer, comm, device, owned
        self.old, self.new, self.buffer_bytes = old, new, buffer_bytes
        self.report: dict = {}

    def run(self) -> None:
        t0 = time.time()
        me, sizes = self.rank, [p.numel() for p in self.trainer.params]
        group = self.comm.get(self.old if len(self.old) >= len(self.new) else self.new)
        owner_of = [owner_of_each(sizes, ranks) for ranks in (self.old, self.new)]
        opt, device = self.trainer.optimizer, self.device
        buf = torch.empty(max(1, min(max(sizes), self.buffer_bytes // 4)), dtype=torch.float32, device=device)
        side = streams.side_stream(device)
        moved = {"received": 0, "sent": 0}
        for i, p in enumerate(self.trainer.params):
            src, dst = owner_of[0][i], owner_of[1][i]
            if src == dst or me not in (src, dst):
                continue
            if me == src:
                moved["sent"] += self._send_state(p, dst, group, buf, side)
            else:
                moved["received"] += self._receive_state(p, src, group, buf, side)
        if me not in self.new:
            opt.state.clear()
        else:
            self.owned.stepped = self.owned.stepped or bool(opt.state)
        self.report = {"bytes": moved["received"], "sent_bytes": moved["sent"], "seconds": time.time() - t0,
                       "peak_buffer_bytes": 4 * buf.numel()}

    def _send_state(self, p: torch.Tensor, dst: int, group, buf: torch.Tensor, side: streams.SideStream) -> int:
        """Parameter p's state to its new owner `dst`, then freed here; returns the bytes sent."""
        transport, device = self.comm.transport, self.device
        state = self.trainer.optimizer.state.pop(p, None)
        transport.send(torch.tensor([-1.0 if state is None else float(state["step"])], device=device), dst, group)
        if state is None:
            return 4
        sent = 4
        with side:  # the chunk copies out of the state, beside the training stream
            for key in self.trainer.state_fields():
                flat = state[key].view(-1)
                for lo in range(0, flat.numel(), buf.numel()):
                    chunk = buf[:min(buf.numel(), flat.numel() - lo)]
                    chunk.copy_(flat[lo:lo + chunk.numel()])
                    transport.send(chunk, dst, group)
                    sent += 4 * chunk.numel()
            del flat
        # the side stream's copies read the state: they must be done before its memory goes back to
        # the allocator, which would hand it to the training stream's next allocation at once
        side.synchronize()
        del state
        return sent

    def _receive_state(self, p: torch.Tensor, src: int, group, buf: torch.Tensor, side: streams.SideStream) -> int:
        """Parameter p's state from its old owner `src` into fresh state here; returns the bytes."""
        transport, device = self.comm.transport, self.device
        step = torch.empty(1, dtype=torch.float32, device=device)
        transport.recv(step, src, group)
        if step.item() < 0:
            return 4
        received = 4
        state = self.trainer.fresh_state(p)  # on the training stream, where the state lives on
        state["step"].fill_(step.item())
        with side:  # waits for the training stream's work on the fresh state, then writes it
            for key in self.trainer.state_fields():
                flat = state[key].view(-1)
                for lo in range(0, flat.numel(), buf.numel()):
                    chunk = buf[:min(buf.numel(), flat.numel() - lo)]
                    transport.recv(chunk, src, group)
                    flat[lo:lo + chunk.numel()].copy_(chunk)
                    received += 4 * chunk.numel()
        side.synchronize()  # whole before the step (or a checkpoint) reads it on the training stream
        self.trainer.optimizer.state[p] = state
        return received
