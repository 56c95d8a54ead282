"""The gradient exchange of the replicated and optimizer-sharded states: a device folds each
micro-batch gradient it computes into the fixed tree at once (training/reduce.py `TreeAccumulator`:
the aligned nodes of the micro-batches it holds, about log2(M) + 1 flat gradients, never M), and
the reduction is transport plus one fixed order: every rank of the group combines one contiguous
slice of the flat gradient, receiving that slice of every rank's nodes point to point and adding
them in the tree order; the combined slices then return to every rank by all-gather. So each rank
receives about (nodes / W + 1) model gradients per update, not W x nodes, and the update is the
colocated loop's, bit for bit, for any number of train devices (addition is element-wise: a
slice's sums are the whole tensor's).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from poise.training.reduce import TreeAccumulator, combine, index_nodes
from poise.training.state.placement import slice_bounds
from poise.training.state.protocol import refused
from poise.training.trainer import GradientConsumer


def exchange_and_combine(nodes: dict[tuple[int, int], torch.Tensor], m: int, ranks: list[int], rank: int, group,
                         numel: int, device: torch.device, rows: int, bounds: list[tuple[int, int]] | None = None,
                         gather: bool = True, *, transport) -> tuple[torch.Tensor, int]:
    """The root of the tree over m micro-batches whose nodes the `ranks` hold between them (this
    rank's are `nodes`, `rows` the most any rank holds); returns it, flat, and the bytes this rank
    received. `bounds`: the slice each rank combines (default: equal slices); `gather=False`
    (sharded: each owner needs its own slice only) returns this rank's combined slice and skips
    step 4. `transport`: of the point-to-point slices (send/recv/isend/irecv, as
    runtime/transport.py's).

    1. Node names: an all-gather of each rank's (level, index) pairs, `rows` of them (a few floats).
    2. Slices: rank i gets slice i of every other rank's nodes, point to point (transport only).
    3. Combine: rank i adds its slice of all nodes in the fixed tree order (`combine`).
    4. All-gather of the combined slices (padded to the longest by at most one element).
    """
    ranks = sorted(ranks)  # the group's own rank order, which all_gather follows
    parties, me = len(ranks), ranks.index(rank)
    bounds = bounds or slice_bounds(numel, parties)
    mine = sorted(nodes)
    if len(mine) > rows:
        raise RuntimeError(f"device {rank} holds {len(mine)} tree nodes, more than the {rows} the reduction was "
                           "planned for")
    names = torch.full((max(1, rows), 2), -1.0, device=device)
    for i, (level, index) in enumerate(mine):
        names[i, 0], names[i, 1] = level, index
    gathered = [torch.empty_like(names) for _ in ranks]
    dist.all_gather(gathered, names, group=group)
    received = 4 * parties * names.numel()
    lo, hi = bounds[me]
    table: dict[tuple[int, int], torch.Tensor] = {node: nodes[node][lo:hi] for node in mine}
    pending = []
    for peer, peer_names in enumerate(gathered):
        if peer == me:
            for node in mine:  # the other ranks' slices of this rank's nodes, in node order
                for other in range(parties):
                    a, b = bounds[other]
                    if other != me and b > a:  # an owner of no parameter gets nothing
                        pending.append(transport.isend(nodes[node][a:b].contiguous(), ranks[other], group))
            continue
        for row in peer_names.tolist():
            if row[0] < 0:
                continue
            node = (int(row[0]), int(row[1]))
            if node in table:
                raise RuntimeError(f"tree node {node} is held by two devices")
            table[node] = torch.empty(hi - lo, dtype=torch.float32, device=device)
            if hi > lo:
                pending.append(transport.irecv(table[node], ranks[peer], group))
                received += 4 * (hi - lo)
    for work in pending:
        work.wait()
    part = combine(table, m, torch.add) if hi > lo else torch.zeros(0, device=device)
    if not gather:
        return part, received
    width = max(b - a for a, b in bounds)
    padded = torch.zeros(width, dtype=torch.float32, device=device)
    padded[:hi - lo] = part
    pieces = [torch.empty_like(padded) for _ in ranks]
    dist.all_gather(pieces, padded, group=group)
    received += 4 * width * parties
    total = torch.cat([piece[:b - a] for piece, (a, b) in zip(pieces, bounds)])
    return total, received


class HeldGradients:
    """The flat micro-batch gradients one device computed in the current mini-batch: bitwise, the
    tree's aligned nodes; semantic, their running sum (reassociation allowed). The gradient
    exchange (protocol.py `GradientExchange`) of the states that hold whole parameters; `holds`:
    the state's words for how it holds them, for the rounds it refuses."""

    def __init__(self, rank: int, numel: int, device: torch.device, bitwise: bool, comm, holds: str) -> None:
        self.rank, self.numel, self.device, self.bitwise, self.comm = rank, numel, device, bitwise, comm
        self.holds = holds
        self._tree = TreeAccumulator(torch.add)
        self._sum: torch.Tensor | None = None

    def keep_gradient(self, index: int, flat: torch.Tensor) -> int:
        """Fold micro-batch `index`'s gradient in; returns the tree nodes held (0 semantic)."""
        if self.bitwise:
            self._tree.push(index, flat)
        else:
            self._sum = flat if self._sum is None else self._sum.add_(flat)
        return len(self._tree)

    def begin_round(self, ranks: list[int], index: int | None) -> GradientConsumer:
        raise refused(self.rank, "a lockstep round", self.holds, "only fully sharded parameters train in rounds")

    def end_round(self) -> None:
        return None

    def contribute(self, m: int, indices: list[int], ranks: list[int], rows: int) -> None:
        self.reduce(m, indices, ranks, rows)

    def reduce(self, m: int, indices: list[int], ranks: list[int], rows: int,
               bounds: list[tuple[int, int]] | None = None) -> tuple[torch.Tensor, int | None]:
        """The mini-batch's summed gradient (flat) and the bytes this rank received for it (bitwise);
        with `bounds` (sharded, bitwise) only this rank's slice of it."""
        group = self.comm.get(ranks)
        if not self.bitwise:
            total = self._sum if self._sum is not None else torch.zeros(self.numel, device=self.device)
            self._sum = None
            dist.all_reduce(total, group=group)
            return total, None  # what the backend's all-reduce moves is its own
        nodes = self._tree.nodes(m)
        if sorted(nodes) != sorted(index_nodes(indices, m)):  # the tree's invariant, checked where it is used
            raise RuntimeError(f"device {self.rank}: tree nodes {sorted(nodes)} are not the aligned nodes of "
                               f"micro-batches {sorted(indices)}")
        return exchange_and_combine(nodes, m, ranks, self.rank, group, self.numel, self.device, rows, bounds,
                                    gather=bounds is None, transport=self.comm.transport)
