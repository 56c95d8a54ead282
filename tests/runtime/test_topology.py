"""The topology is a value: start-up, a live or hard resize, a join and a recovery each make a new
one in the fixed layout (rollout devices first, the train group after them, joined reserve devices
last among the rollout devices), and nothing assigns into one."""

import dataclasses

import pytest

from poise.policy.split import Split
from poise.runtime.topology import Topology


def test_the_fixed_layout_of_a_split():
    t = Topology.of_split(Split(2, 3))
    assert (t.rollout, t.train, t.joined) == ((0, 1), (2, 3, 4), ())
    assert (t.split, t.leader) == (Split(2, 3), 2)
    assert [t.role_of(d) for d in range(6)] == ["rollout", "rollout", "train", "train", "train", "idle"]


def test_joined_reserve_devices_stay_rollout_devices_after_a_restart():
    """Pool of 4 (2+2) and reserve devices 4, 5: after both join the split is 4+2, and a restart in
    that split (recovery) keeps the pool's layout with the joiners as rollout devices."""
    t = Topology.of_split(Split(2, 2)).with_joined([4]).with_joined([5])
    assert (t.rollout, t.train, t.joined, t.split) == ((0, 1, 4, 5), (2, 3), (4, 5), Split(4, 2))
    assert Topology.of_split(t.split, t.joined) == t
    assert t.role_of(5) == "rollout" and t.leader == 2


def test_a_resize_returns_a_new_topology_and_leaves_the_old_one():
    before = Topology.of_split(Split(2, 2))
    after = before.resized(Split(1, 3))
    assert (after.rollout, after.train, after.leader) == ((0,), (1, 2, 3), 1)
    assert (before.rollout, before.train) == ((0, 1), (2, 3))
    assert before.resized(Split(2, 2)) == before
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.train = (1, 2, 3)  # type: ignore[misc]
