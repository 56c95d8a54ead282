"""The rollout engine's preallocated key/value cache: one row per slot, never reallocated.

Layout per layer: keys and values of shape [slots, kv_heads, context, head_dim], the layout
torch SDPA takes, so a decode step attends over a view of the cache without copying it.
The cache is allocated once for the engine's lifetime (no allocation in the decode loop), and
a slot's stale entries beyond its current length are masked, never cleared.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CacheShape:
    layers: int
    slots: int
    kv_heads: int
    context: int
    head_dim: int

    def bytes(self, dtype: torch.dtype) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        return 2 * self.layers * (self.slots + 1) * self.kv_heads * self.context * self.head_dim * element


class KVCache:
    """Keys and values for `shape.slots` sequences of up to `shape.context` tokens each.

    Row `scratch` (one past the last slot) takes the writes of padding rows, so a fixed-shape
    batch never writes into a slot it does not own.
    """

    def __init__(self, shape: CacheShape, dtype: torch.dtype, device: torch.device):
        self.shape = shape
        self.scratch = shape.slots
        size = (shape.slots + 1, shape.kv_heads, shape.context, shape.head_dim)
        # zeros, not empty: masked attention multiplies stale entries by 0, and 0 * NaN is NaN
        self.keys = [torch.zeros(size, dtype=dtype, device=device) for _ in range(shape.layers)]
        self.values = [torch.zeros(size, dtype=dtype, device=device) for _ in range(shape.layers)]

    def write_tokens(self, layer: int, slots: torch.Tensor, positions: torch.Tensor,
                     keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store one token per row (decode rows and prompt tokens alike).

        slots, positions: [N] int64 (distinct pairs); keys, values: [N, kv_heads, head_dim].
        """
        self.keys[layer][slots, :, positions] = keys
        self.values[layer][slots, :, positions] = values
