"""Decode groups: which decode rows of a step attend together, over how many keys. Torch-free.

The fast path cuts the rows by context length (`plan_decode_groups`: a long tail of a few long
sequences beside many short ones attends as a few rows over long contexts and many over short
ones); the batch-invariant path gives each row a key length that is a function of the row alone
(`key_bucket`) and groups the rows by it (`plan_bucket_groups`). `DecoderRunner`
(rollout/runner.py) turns each plan into attention calls over the slot KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

# About what one more attention call (plus its key/value copy) costs, in attended
# (query row, key) pairs: a group is split off only when it saves more than this.
GROUP_OVERHEAD = 1024
MAX_DECODE_GROUPS = 4
# A decode group whose slot range is more than this many times its rows copies its rows' cache
# slots; otherwise it attends a view of the range (idle slots in it get zero queries).
GATHER_SPAN = 1.25
# Batch-invariant rows: the smallest key bucket, and buckets per doubling of the context. Few
# buckets measured fastest on CPU (each is one more attention call, which costs more than
# attending up to twice the keys): 2 or 4 per doubling cost 4-10% more than 1, and a smallest
# bucket of 32 cost ~10% more than 64 on the long workload of benchmarks/engine.py.
BUCKET_MIN = 64
BUCKETS_PER_OCTAVE = 1


@dataclass(frozen=True)
class DecodeGroupPlan:
    """Decode rows that attend over one key length.

    rows: indices into the step's decode rows, in increasing slot order; length: keys attended
    (the group's longest position + 1). gather False: attend a view of cache slots [lo, hi)
    (slots in it without a row of the group get zero queries); True: copy the rows' own slots.
    """

    rows: tuple[int, ...]
    length: int
    lo: int
    hi: int
    gather: bool


def plan_decode_groups(slots: list[int], positions: list[int], overhead: int = GROUP_OVERHEAD,
                       max_groups: int = MAX_DECODE_GROUPS) -> list[DecodeGroupPlan]:
    """Cut decode rows (slots, positions; increasing slots) into groups by context length.

    Rows are sorted longest first and cut where the cut saves the most attended (row, key)
    pairs, while that saving exceeds `overhead`: a long tail of a few long sequences beside many
    short ones becomes a few rows over long contexts and many over short ones, instead of every
    row over the longest. Groups come longest first.
    """
    n = len(slots)
    order = sorted(range(n), key=lambda r: -positions[r])
    lengths = [positions[r] + 1 for r in order]
    cuts = [0]
    while len(cuts) < max_groups:
        start, best, cut = cuts[-1], overhead, None
        top = lengths[start]
        for k in range(start + 1, n):
            saving = (n - k) * (top - lengths[k])  # rows k.. would attend lengths[k] keys, not top
            if saving > best:
                best, cut = saving, k
        if cut is None:
            break
        cuts.append(cut)
    cuts.append(n)
    plans = []
    for a, b in zip(cuts, cuts[1:]):
        rows = tuple(sorted(order[a:b]))
        lo, hi = slots[rows[0]], slots[rows[-1]] + 1
        # a view while at most a fifth of its range idles; else copying the rows' slots is cheaper
        plans.append(DecodeGroupPlan(rows, lengths[a], lo, hi, gather=hi - lo > GATHER_SPAN * len(rows)))
    return plans


def key_bucket(position: int, context: int) -> int:
    """Keys that a batch-invariant decode row at `position` attends over (masked beyond it).

    A function of the row alone: SDPA's bits change with the key length even where the extra keys
    are masked, and nothing promises that the CPU path's reductions (softmax's vector loop and its
    tail, the GEMM's blocking over keys) do not, so a row's key length must not be its group's
    longest context (the fast path's choice). Buckets grow geometrically (BUCKETS_PER_OCTAVE = 1:
    64, 128, 256, ...), capped at the context, so a step's rows fall into few buckets, at the
    price of attending up to twice the keys.
    """
    need = position + 1
    if need <= BUCKET_MIN:
        return min(BUCKET_MIN, context)
    top = 1 << (need - 1).bit_length()  # the power of two >= need
    step = top // (2 * BUCKETS_PER_OCTAVE)
    return min(-(-need // step) * step, context)


def plan_bucket_groups(slots: list[int], positions: list[int], context: int) -> list[DecodeGroupPlan]:
    """Batch-invariant decode groups (slots increasing): one per key bucket, longest first."""
    buckets: dict[int, list[int]] = {}
    for row, position in enumerate(positions):
        buckets.setdefault(key_bucket(position, context), []).append(row)
    plans = []
    for length in sorted(buckets, reverse=True):
        rows = tuple(buckets[length])
        lo, hi = slots[rows[0]], slots[rows[-1]] + 1
        plans.append(DecodeGroupPlan(rows, length, lo, hi, gather=hi - lo > GATHER_SPAN * len(rows)))
    return plans
