"""Fixed binary-tree summation over micro-batch index (docs/design.md invariant 3).

Node (level L, index i) covers micro-batches [i * 2^L, (i + 1) * 2^L) ∩ [0, M). Its sum is
left child + right child, or the left child alone when the right one is empty. Any contiguous
range of micro-batches splits into aligned nodes (`aligned_nodes`), so each train device can
sum its own range into nodes and the nodes combine (`combine`) into exactly the same root as
one device summing all M leaves — floating-point addition happens in one fixed order.

`TreeAccumulator` folds leaves into that tree as they arrive (a binary counter of partial sums):
a device holds one value per pending node — about log2(M) + 1 for leaves in order — instead of
one per micro-batch, with the same additions in the same order.
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


class TreeAccumulator:
    """Micro-batch values folded into the fixed tree as they arrive, in any order.

    A node is formed as soon as both its children are held (left + right, the tree's order); a
    leaf's or node's value is dropped once it is part of its parent. The number of micro-batches
    need not be known while leaves arrive: `nodes(m)` then also lifts a node whose right sibling
    lies past m (a parent with an empty right subtree is its left child, as in `node_sum`), so the
    nodes it returns are exactly `index_nodes(held, m)` with their `node_sum` values.
    """

    def __init__(self, add: Callable[[V, V], V]):
        self.add = add
        self._nodes: dict[Node, V] = {}
        self.leaves: set[int] = set()
        self.peak = 0  # the most values held at once: the memory bound the streaming buys

    def __len__(self) -> int:
        return len(self._nodes)

    def push(self, index: int, value: V, m: int | None = None) -> None:
        """Micro-batch `index`'s value; `m`, when known, lets a node with an empty right sibling
        rise at once instead of at `nodes`."""
        if index < 0 or index in self.leaves:
            raise ValueError(f"micro-batch {index} pushed twice or negative")
        self.leaves.add(index)
        self._rise((0, index), value, m)
        self.peak = max(self.peak, len(self._nodes))

    def _rise(self, node: Node, value: V, m: int | None) -> None:
        level, i = node
        while True:
            if m is not None and level >= tree_levels(m):
                break
            right_empty = m is not None and i % 2 == 0 and (i + 1) << level >= m
            sibling = (level, i ^ 1)
            if right_empty:
                pass  # the parent is this node alone
            elif sibling in self._nodes:
                other = self._nodes.pop(sibling)
                value = self.add(value, other) if i % 2 == 0 else self.add(other, value)
            else:
                break
            level, i = level + 1, i >> 1
        self._nodes[(level, i)] = value

    def nodes(self, m: int) -> dict[Node, V]:
        """Every held node, lifted and merged as far as a tree of m micro-batches allows, and
        cleared from the accumulator."""
        if self.leaves and max(self.leaves) >= m:
            raise ValueError(f"micro-batch {max(self.leaves)} is outside a tree of {m} micro-batches")
        pending = sorted(self._nodes.items())
        self._nodes, self.leaves = {}, set()
        for node, value in pending:
            if node not in self._nodes:
                self._rise(node, value, m)
        out, self._nodes = self._nodes, {}
        return out
