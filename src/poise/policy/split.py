"""The splits a job may take. `Split` and `parse_splits` are the config layer's
(poise.config.split): the `cluster.split` and `resize:` sections name splits too."""

from __future__ import annotations

from poise.config.split import Split, parse_splits
from poise.errors import ConfigError


def all_splits(devices: int, rollout_multiple: int = 1, min_train: int = 1) -> list[Split]:
    """Every split of `devices` whose rollout count is a multiple of the instance size."""
    if devices < 2:
        raise ConfigError("devices", devices, "need at least 2 devices: one rollout, one train")
    out = []
    for r in range(rollout_multiple, devices, rollout_multiple):
        if devices - r >= min_train:
            out.append(Split(r, devices - r))
    if not out:
        raise ConfigError("devices", devices,
                          f"no split leaves {min_train}+ train devices with rollout a multiple of "
                          f"{rollout_multiple}; add devices or shrink the rollout instance")
    return out

