"""Which train device owns which parameters, and the collectives that move owned runs.

Owners hold contiguous runs of whole parameters, in `named_parameters` order: the run of owner i
ends at the first parameter boundary at or past i/W of the elements. Whole tensors keep every
per-tensor operation whole (the gradient norm of a tensor, AdamW's update of a tensor), so an
owner's arithmetic is the unsharded arithmetic on the same tensors, bit for bit; contiguous runs
keep every owner's part of the flat gradient one slice, so the reduction's transport is the
unsharded one with other slice bounds. A function of the shapes and W alone: every device
computes the same owners without talking.
"""

from __future__ import annotations

import bisect
from typing import Sequence

import torch
import torch.distributed as dist

from poise.training.state.protocol import refused

PARAMETER_CHUNK = 4 * 2**20  # elements per owner per all-gather of updated parameters (16 MB in fp32)


def owner_runs(sizes: Sequence[int], parties: int) -> list[tuple[int, int]]:
    """Per owner, the parameters [first, end) it owns (a run may be empty when there are more
    owners than parameters)."""
    if parties < 1:
        raise ValueError(f"{parties} owners: there must be at least one")
    total = sum(sizes)
    runs, first, seen = [], 0, 0
    for i in range(parties):
        target = total * (i + 1) // parties
        end = first
        while end < len(sizes) and (seen < target or i == parties - 1):
            seen += sizes[end]
            end += 1
        runs.append((first, end))
        first = end
    return runs


def owner_of_each(sizes: Sequence[int], ranks: Sequence[int]) -> list[int]:
    """Per parameter, the rank of its owner among sorted train devices `ranks`."""
    return [ranks[r] for r, (a, b) in enumerate(owner_runs(sizes, len(ranks))) for _ in range(a, b)]


def element_bounds(sizes: Sequence[int], runs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The owners' runs as slices [lo, hi) of the flat vector of every parameter's elements."""
    offsets = [0]
    for n in sizes:
        offsets.append(offsets[-1] + n)
    return [(offsets[a], offsets[b]) for a, b in runs]


def slice_bounds(numel: int, parties: int) -> list[tuple[int, int]]:
    """The contiguous slice of a flat gradient that each of `parties` ranks combines."""
    return [(numel * i // parties, numel * (i + 1) // parties) for i in range(parties)]


@torch.no_grad()
def gather_runs(params: list[torch.Tensor], bounds: list[tuple[int, int]], me: int, group,
                chunk: int = PARAMETER_CHUNK) -> int:
    """Every owner's run (`bounds`: element ranges of the flat parameters, in the group's rank
    order; this rank is `me`) into `params`, by all-gathers of at most `chunk` elements per owner:
    one buffer of W x chunk, never a second copy of the model. Returns the bytes received."""
    flat = _FlatParameters(params)
    width = max(b - a for a, b in bounds)
    received = 0
    for offset in range(0, width, chunk):
        n = min(chunk, width - offset)
        mine = torch.zeros(n, dtype=params[0].dtype, device=params[0].device)
        lo, hi = bounds[me]
        if lo + offset < hi:
            flat.read(lo + offset, mine[:min(n, hi - lo - offset)])
        pieces = [torch.empty_like(mine) for _ in bounds]
        dist.all_gather(pieces, mine, group=group)
        received += mine.element_size() * n * len(bounds)
        for owner, ((a, b), piece) in enumerate(zip(bounds, pieces)):
            if owner != me and a + offset < b:
                flat.write(a + offset, piece[:min(n, b - a - offset)])
        del pieces
    return received


def gather_ragged(mine: torch.Tensor, counts: list[int], me: int, group) -> torch.Tensor:
    """Every rank's 1-D tensor (rank i's has counts[i] elements), concatenated in rank order: an
    all-gather padded to the longest (transport only)."""
    padded = torch.zeros(max(1, max(counts)), dtype=mine.dtype, device=mine.device)
    padded[:counts[me]] = mine
    pieces = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(pieces, padded, group=group)
    return torch.cat([piece[:n] for piece, n in zip(pieces, counts)])


class _FlatParameters:
    """The parameters as one flat vector, read and written by element range without building it."""

    def __init__(self, params: list[torch.Tensor]):
        self.params = params
        self.starts = [0]
        for p in params:
            self.starts.append(self.starts[-1] + p.numel())

    def _spans(self, lo: int, n: int):
        i = bisect.bisect_right(self.starts, lo) - 1
        done = 0
        while done < n:
            p, at = self.params[i], lo + done - self.starts[i]
            k = min(p.numel() - at, n - done)
            yield p.view(-1)[at:at + k], done, k
            done += k
            i += 1

    def read(self, lo: int, out: torch.Tensor) -> None:
        for view, done, k in self._spans(lo, out.numel()):
            out[done:done + k].copy_(view)

    def write(self, lo: int, values: torch.Tensor) -> None:
        for view, done, k in self._spans(lo, values.numel()):
            view.copy_(values[done:done + k])


class WholeWeights:
    """The weight placement (protocol.py `WeightPlacement`) of the states that hold the whole model
    on every device (`none`, `optimizer`): nothing to gather or shard on a resize. `holds`: the
    state's words for how it holds them, for the part-loaded model it refuses."""

    def __init__(self, rank: int, holds: str) -> None:
        self.rank, self.holds = rank, holds

    def reshard(self, new_ranks: list[int]) -> tuple[int, int]:
        return 0, 0  # every device holds the whole model

    def shard_over(self, ranks: list[int]) -> None:
        return None

    def adopt(self, ranks: list[int]) -> None:
        raise refused(self.rank, "started with a part of the weights", self.holds, "it needs the whole model")
