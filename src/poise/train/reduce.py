"""Fixed binary-tree summation over micro-batch index (DESIGN.md invariant 3).

Node (level L, index i) covers micro-batches [i * 2^L, (i + 1) * 2^L) ∩ [0, M). Its sum is
left child + right child, or the left child alone when the right one is empty. Any contiguous
range of micro-batches splits into aligned nodes (`aligned_nodes`), so each train device can
sum its own range into nodes and the nodes combine (`combine`) into exactly the same root as
one device summing all M leaves — floating-point addition happens in one fixed order.
"""

from __future__ import annotations

from typing import Callable, TypeVar

V = TypeVar("V")

Node = tuple[int, int]  # (level, index)


def tree_levels(m: int) -> int:
    """Height of the tree over m leaves: the smallest L with 2^L >= m."""
    if m < 1:
        raise ValueError(f"need at least one micro-batch, got {m}")
    return max(0, (m - 1).bit_length())


def aligned_nodes(lo: int, hi: int, m: int) -> list[Node]:
    """The maximal aligned tree nodes covering micro-batches [lo, hi) of a step with m of them."""
    if not 0 <= lo < hi <= m:
        raise ValueError(f"bad range [{lo}, {hi}) for {m} micro-batches")
    nodes = []
    while lo < hi:
        level = 0
        # grow while the node stays aligned and its non-empty part stays inside [lo, hi)
        while lo % (1 << (level + 1)) == 0 and min(lo + (1 << (level + 1)), m) <= hi and (1 << (level + 1)) <= (
                1 << tree_levels(m)):
            level += 1
        nodes.append((level, lo >> level))
        lo = min(lo + (1 << level), m)
    return nodes


def index_nodes(indices, m: int) -> list[Node]:
    """The aligned nodes covering a set of micro-batch indices: those of each maximal contiguous
    run (a device that streamed some micro-batches and took a share of the tail holds several)."""
    nodes: list[Node] = []
    ordered = sorted(indices)
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            nodes += aligned_nodes(ordered[start], ordered[i - 1] + 1, m)
            start = i
    return nodes


def node_sum(node: Node, m: int, leaf: Callable[[int], V], add: Callable[[V, V], V]) -> V:
    """Sum of a node's leaves in tree order; `leaf(i)` gives micro-batch i's value."""
    level, index = node
    if level == 0:
        return leaf(index)
    left = (level - 1, 2 * index)
    right = (level - 1, 2 * index + 1)
    left_sum = node_sum(left, m, leaf, add)
    if right[1] << right[0] >= m:  # right subtree is empty
        return left_sum
    return add(left_sum, node_sum(right, m, leaf, add))


def combine(nodes: dict[Node, V], m: int, add: Callable[[V, V], V]) -> V:
    """Root sum from node sums that partition [0, m) (e.g. gathered from several devices)."""
    root = (tree_levels(m), 0)

    def value(node: Node) -> V:
        if node in nodes:
            return nodes[node]
        level, index = node
        if level == 0:
            raise KeyError(f"micro-batch {index} is missing from the reduction")
        left, right = (level - 1, 2 * index), (level - 1, 2 * index + 1)
        if right[1] << right[0] >= m:
            return value(left)
        return add(value(left), value(right))

    return value(root)


def tree_sum(values: list[V], add: Callable[[V, V], V]) -> V:
    """Sum of all values in the fixed tree order (the one-device case)."""
    return node_sum((tree_levels(len(values)), 0), len(values), values.__getitem__, add)
