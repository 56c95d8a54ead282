import itertools

import pytest
import torch

from poise.training.reduce import aligned_nodes, combine, index_nodes, node_sum, tree_sum


def _split_sum(values, cuts, add):
    m = len(values)
    bounds = [0, *cuts, m]
    nodes = {}
    for lo, hi in zip(bounds, bounds[1:]):
        for node in aligned_nodes(lo, hi, m):
            nodes[node] = node_sum(node, m, values.__getitem__, add)
    return combine(nodes, m, add)


@pytest.mark.parametrize("m", range(1, 14))
def test_any_contiguous_split_reduces_in_the_same_order(m):
    add = lambda a, b: f"({a}+{b})"  # noqa: E731 - the expression records the order of additions
    leaves = [str(i) for i in range(m)]
    reference = tree_sum(leaves, add)
    for parts in range(1, min(4, m) + 1):
        for cuts in itertools.combinations(range(1, m), parts - 1):
            assert _split_sum(leaves, cuts, add) == reference


def test_float_sums_are_bitwise_equal_across_device_counts():
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(1000, generator=gen) * 10 ** float(i % 7) for i in range(11)]
    add = lambda a, b: a + b  # noqa: E731
    one = tree_sum(grads, add)
    for devices in (2, 3, 4, 5):
        size = -(-len(grads) // devices)
        cuts = [i * size for i in range(1, devices) if i * size < len(grads)]
        assert torch.equal(_split_sum(grads, cuts, add), one)
    # and the tree order really differs from a left fold, so the test can fail
    left_fold = grads[0]
    for g in grads[1:]:
        left_fold = left_fold + g
    assert not torch.equal(left_fold, one)


def test_missing_micro_batch_fails_loudly():
    with pytest.raises(KeyError, match="micro-batch 2"):
        combine({(1, 0): 1.0}, 3, lambda a, b: a + b)


@pytest.mark.parametrize("m", range(1, 12))
def test_any_assignment_of_micro_batches_reduces_in_the_same_order(m):
    """pipeline.assist: a device holds any set of micro-batches (streamed ones plus a share of the
    tail); the aligned nodes of its runs still combine into the one tree order."""
    add = lambda a, b: f"({a}+{b})"  # noqa: E731 - the expression records the order of additions
    leaves = [str(i) for i in range(m)]
    reference = tree_sum(leaves, add)
    for owners in itertools.product(range(3), repeat=m):  # every assignment of m micro-batches to 3 devices
        nodes = {}
        for d in range(3):
            mine = [j for j in range(m) if owners[j] == d]
            for node in index_nodes(mine, m):
                assert node not in nodes
                nodes[node] = node_sum(node, m, leaves.__getitem__, add)
        assert combine(nodes, m, add) == reference


def test_index_nodes_by_hand():
    assert index_nodes([], 6) == []
    assert index_nodes([0, 1, 2, 3], 6) == [(2, 0)]
    assert index_nodes([5, 0, 1, 3], 6) == [(1, 0), (0, 3), (0, 5)]  # runs [0, 2), [3, 4), [5, 6)


@pytest.mark.parametrize("m", range(1, 12))
def test_streaming_accumulator_holds_the_aligned_nodes_with_their_tree_sums(m):
    """Leaves pushed in any order, with or without m known, fold into exactly `index_nodes` of the
    held set, each with its `node_sum` (the additions recorded as strings), and combine into the
    one-device tree sum."""
    from poise.training.reduce import TreeAccumulator

    add = lambda a, b: f"({a}+{b})"  # noqa: E731 - the expression records the order of additions
    leaves = [str(i) for i in range(m)]
    gen = torch.Generator().manual_seed(m)
    for trial in range(40):
        owners = torch.randint(0, 3, (m,), generator=gen).tolist()
        nodes = {}
        for d in range(3):
            mine = [j for j in range(m) if owners[j] == d]
            order = [mine[k] for k in torch.randperm(len(mine), generator=gen).tolist()]
            acc = TreeAccumulator(add)
            for j in order:
                acc.push(j, leaves[j], m if trial % 2 else None)
            held = acc.nodes(m)
            assert sorted(held) == sorted(index_nodes(mine, m))
            for node, value in held.items():
                assert value == node_sum(node, m, leaves.__getitem__, add)
            assert len(acc) == 0
            nodes.update(held)
        assert combine(nodes, m, add) == tree_sum(leaves, add)


def test_streaming_accumulator_holds_log_m_values_in_order():
    """The memory bound: leaves in order leave at most log2(M) + 1 partial sums held at once
    (one per set bit of the count), where keeping every micro-batch holds M."""
    from poise.training.reduce import TreeAccumulator

    for m in (1, 2, 5, 16, 33, 64):
        acc = TreeAccumulator(lambda a, b: a + b)
        for j in range(m):
            acc.push(j, torch.ones(3) * j, m)
        assert acc.peak <= m.bit_length()  # floor(log2 m) + 1
        (root, total), = acc.nodes(m).items()
        assert torch.equal(total, tree_sum([torch.ones(3) * j for j in range(m)], lambda a, b: a + b))


def test_streaming_accumulator_refuses_a_leaf_twice_or_past_m():
    from poise.training.reduce import TreeAccumulator

    acc = TreeAccumulator(lambda a, b: a + b)
    acc.push(0, 1.0)
    with pytest.raises(ValueError, match="twice"):
        acc.push(0, 1.0)
    acc.push(3, 1.0)
    with pytest.raises(ValueError, match="outside a tree of 3"):
        acc.nodes(3)
