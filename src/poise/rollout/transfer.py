"""Host-to-device copies of the engine's small per-step tensors (token ids, positions, slots,
noise rows, sampling keys), made without a host sync.

`torch.tensor(values, device="cuda")` copies from pageable host memory, and torch waits for that
copy, and so for all the work queued before it on the stream, before it returns: in the decode
loop each such copy would stall the host once per step behind the step's kernels. Copied from
pinned memory with `non_blocking=True` the host queues the copy and goes on (torch's pinned-memory
cache keeps the block until the copy has run), so the one wait left per step is where the
scheduler reads the sampled tokens. On the CPU this is `torch.tensor` itself.
"""

from __future__ import annotations

import torch


def to_device(values: list, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """`values` (a list, or a list of rows) as a `dtype` tensor on `device`, the host not waiting."""
    host = torch.tensor(values, dtype=dtype)
    if device.type == "cpu":
        return host
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)
