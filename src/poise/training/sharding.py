"""Which train device owns which parameters (`cluster.shard: optimizer`), and the all-or-nothing
check on the optimizer state an owner holds.

Owners hold contiguous runs of whole parameters, in `named_parameters` order: the run of owner i
ends at the first parameter boundary at or past i/W of the elements. Whole tensors keep every
per-tensor operation whole (the gradient norm of a tensor, AdamW's update of a tensor), so an
owner's arithmetic is the unsharded arithmetic on the same tensors, bit for bit; contiguous runs
keep every owner's part of the flat gradient one slice, so the reduction's transport is the
unsharded one with other slice bounds. A function of the shapes and W alone: every device
computes the same owners without talking.
"""

from __future__ import annotations

from typing import Sequence


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


def element_bounds(sizes: Sequence[int], runs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The owners' runs as slices [lo, hi) of the flat vector of every parameter's elements."""
    offsets = [0]
    for n in sizes:
        offsets.append(offsets[-1] + n)
    return [(offsets[a], offsets[b]) for a, b in runs]
