"""Which device holds which role: a frozen value that start-up makes and a resize, a recovery or a
join returns anew; the runtime installs it (`Runtime.install`), nothing assigns into it.

The layout is fixed (runtime/resize.py): the pool's rollout devices are ranks [0, r), its train
devices follow, the train leader is the first of them; reserve devices that joined
(runtime/scale.py) are rollout devices after the pool's. The weights version is not part of it:
it moves every step, a topology only at a resize, a join or a recovery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from poise.policy.split import Split


@dataclass(frozen=True)
class Topology:
    rollout: tuple[int, ...]  # the rollout devices: the pool's, then the joined reserve's
    train: tuple[int, ...]  # the train group; its first device is the leader
    joined: tuple[int, ...] = ()  # reserve devices that joined: rollout devices from then on

    @classmethod
    def of_split(cls, split: Split, joined: Sequence[int] = ()) -> Topology:
        """The fixed layout of `split`, whose rollout devices include the `joined` reserve ones."""
        pool_rollout = split.rollout - len(joined)
        return cls(tuple(range(pool_rollout)) + tuple(joined),
                   tuple(range(pool_rollout, pool_rollout + split.train)), tuple(joined))

    @property
    def split(self) -> Split:
        return Split(len(self.rollout), len(self.train))

    @property
    def leader(self) -> int:
        """The train device that sends the weights and saves the checkpoints."""
        return self.train[0]

    def role_of(self, device: int) -> str:
        return "train" if device in self.train else "rollout" if device in self.rollout else "idle"

    def resized(self, to: Split) -> Topology:
        """After a live resize to `to`: the pool's devices in the fixed layout of `to` (scale-out and
        resizing exclude each other, so no reserve device has joined)."""
        return Topology(tuple(range(to.rollout)), tuple(range(to.rollout, to.rollout + to.train)), self.joined)

    def with_joined(self, devices: Sequence[int]) -> Topology:
        """After reserve `devices` joined as rollout devices."""
        return Topology(self.rollout + tuple(devices), self.train, self.joined + tuple(devices))


class Devices(Protocol):
    """The running job as a resize, a recovery, a join and the checkpoint store see it: one worker
    actor per device (indexed by rank) and the topology they are in (runtime.runtime.Runtime)."""

    workers: list
    topology: Topology

    @property
    def sharded(self) -> bool:
        """Each train device owns part of the optimizer state (`cluster.shard: optimizer | full`)."""
        ...

    @property
    def fully_sharded(self) -> bool:
        """The parameters are sharded too (`cluster.shard: full`)."""
        ...
