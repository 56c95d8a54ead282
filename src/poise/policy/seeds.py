"""Derived seeds: every random choice of a simulation, and of the dispatcher and ranker wherever
they run, draws from a `random.Random` seeded by name from the job's seed, so adding a consumer
never shifts another's stream."""

from __future__ import annotations


def stable_seed(*parts: object) -> int:
    """A stable 63-bit seed from `parts` (FNV-1a of their repr; Python's hash() of a str is
    salted per process)."""
    h = 1469598103934665603
    for ch in repr(parts).encode():
        h = ((h ^ ch) * 1099511628211) & ((1 << 63) - 1)
    return h


__all__ = ["stable_seed"]
