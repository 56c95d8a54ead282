"""Host-to-device copies of the engine's small per-step tensors (token ids, positions, slots,
noise rows, sampling keys), made without a host sync.

`torch.tensor(values, device="cuda")` copies from pageable host memory, and torch waits for that
copy, and so for all the work queued before it on the stream, before it returns: in the decode
loop each such copy would stall the host once per step behind the step's kernels. Copied from
pinned memory with `non_blocking=True` the host queues the copy and goes on (torch's pinned-memory
cache keeps the block until the copy has run), so the one wait left per step is where the
scheduler reads the sampled tokens. On the CPU this is the host tensor itself.

A flat list of ints becomes a tensor through `array.array` and `torch.frombuffer`: the same int64
values, at about a third of `torch.tensor`'s cost, which infers a type per element (a few
microseconds a copy, several copies a decode step).
"""

from __future__ import annotations

from array import array

import torch


def to_device(values: list, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """`values` (a list, or a list of rows) as a `dtype` tensor on `device`, the host not waiting."""
    host = None
    if dtype == torch.int64 and values and type(values[0]) is int:
        try:
            host = torch.frombuffer(array("q", values), dtype=torch.int64)
        except (TypeError, OverflowError):  # a float or an out-of-range int in the list: torch's own rules
            pass
    if host is None:
        host = torch.tensor(values, dtype=dtype)
    if device.type == "cpu":
        return host
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)
