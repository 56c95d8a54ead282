"""The split: how many devices generate (rollout) and how many train.

A `Split` is the one value every policy object trades in: the allocator returns one, the
resize controller moves between them, the simulator and the runtime apply them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from poise.errors import ConfigError


@dataclass(frozen=True, order=True)
class Split:
    """`rollout` devices generate, `train` devices train; both at least one (disaggregated)."""

    rollout: int
    train: int

    def __post_init__(self) -> None:
        for role, n in (("rollout", self.rollout), ("train", self.train)):
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ConfigError(
                    "split", [self.rollout, self.train],
                    f"{role} has {n!r} devices; give each role at least one device, e.g. [6, 2]")

    @property
    def devices(self) -> int:
        return self.rollout + self.train

    def as_list(self) -> list[int]:
        return [self.rollout, self.train]

    def __str__(self) -> str:
        return f"{self.rollout}:{self.train}"

    @staticmethod
    def parse(value: object, key: str = "split") -> "Split":
        """A split from YAML/CLI: `[6, 2]` or `"6:2"`; anything else is a one-line ConfigError."""
        if isinstance(value, Split):
            return value
        if isinstance(value, str) and ":" in value:
            parts: Sequence[object] = value.split(":")
            try:
                parts = [int(p) for p in parts]
            except ValueError:
                parts = [value]
        elif isinstance(value, (list, tuple)):
            parts = list(value)
        else:
            parts = [value]
        if len(parts) != 2 or not all(isinstance(p, int) and not isinstance(p, bool) for p in parts):
            raise ConfigError(key, value, "expected [rollout, train] device counts, e.g. [6, 2] or '6:2'")
        try:
            return Split(int(parts[0]), int(parts[1]))  # type: ignore[arg-type]
        except ConfigError as e:
            raise ConfigError(key, value, e.allowed) from None


def parse_splits(values: Iterable[object], key: str = "allowed_splits") -> tuple[Split, ...]:
    return tuple(Split.parse(v, f"{key}[{i}]") for i, v in enumerate(values))
