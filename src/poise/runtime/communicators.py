"""The torch.distributed groups of a device, cached (DynaResize §3.2): every group a job may use is
created once, at pre-warm, so a live resize finds its communicators ready."""

from __future__ import annotations

import torch.distributed as dist

from poise.runtime.transport import Direct, Transport


class CommunicatorCache:
    """torch.distributed groups keyed by frozenset(ranks), each created once.

    `dist.new_group` is collective over the whole world: every worker must call `get` for the
    same rank sets in the same order, which `DeviceWorker.prewarm_groups` guarantees.
    `transport`: how every point-to-point transfer on these groups moves its tensors, decided once
    by the worker for the world's backend and its device (runtime/transport.py `transport_for`).
    """

    def __init__(self, timeout=None, transport: Transport | None = None) -> None:
        self.timeout = timeout  # of every collective on these groups (cluster.step_timeout_s)
        self.transport: Transport = transport or Direct()
        self._groups: dict[frozenset[int], object] = {}
        self.created_after_prewarm = 0  # groups a resize had to create on its critical path
        self.warmed = 0  # groups of this rank that ran a collective at pre-warm (NCCL's set-up done)
        self._prewarmed = False

    def get(self, ranks: list[int] | tuple[int, ...]):
        key = frozenset(ranks)
        if key not in self._groups:
            self._groups[key] = dist.new_group(sorted(key), timeout=self.timeout)
            self.created_after_prewarm += self._prewarmed
        return self._groups[key]

    def prewarmed(self) -> None:
        self._prewarmed = True

    def __len__(self) -> int:
        return len(self._groups)
