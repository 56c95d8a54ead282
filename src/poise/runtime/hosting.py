"""The driver's handle on a device hosted with others in one Ray actor process
(`runtime/worker.py` DeviceHost, emulated compute only).

A `HostedDevice` is called like an actor handle, `device.method.remote(*args)`, and returns the
call's ObjectRef, so the driver, the services and the fault handler treat both alike. It numbers
the calls it submits; the host runs a device's calls in that order, one at a time, which is what
Ray guarantees a single-threaded actor's caller. The numbering lives in the driver, so the handle
cannot be sent to another process. A call whose ObjectRef argument cannot be resolved never
reaches the host, so the device's later calls wait: the step's deadline (runtime/faults.py)
reports that as a hang. The driver passes no such argument: its only top-level reference is a
micro-batch it put in the object store itself.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

import ray


class HostedDevice:
    def __init__(self, host, rank: int):
        self.host, self.rank = host, rank  # the DeviceHost actor, and this device's rank in it
        self._calls = itertools.count()
        self._lock = threading.Lock()  # a number and its submission together: the host's order is ours

    def __getattr__(self, method: str) -> "_HostedCall":
        if method.startswith("_"):
            raise AttributeError(method)
        return _HostedCall(self, method)

    def __reduce__(self):
        raise TypeError(f"device {self.rank}'s handle numbers its calls in the driver; it cannot be sent to "
                        "another process")

    def __repr__(self) -> str:
        return f"HostedDevice(rank={self.rank})"


@dataclass(frozen=True)
class _HostedCall:
    device: HostedDevice
    method: str

    def remote(self, *args, **kwargs):
        d = self.device
        with d._lock:
            return d.host.call.remote(d.rank, next(d._calls), self.method, *args, **kwargs)


def kill(worker) -> None:
    """ray.kill a device's process: its own actor, or its host (and with it the host's other
    devices, as a crashed process takes all it holds)."""
    ray.kill(worker.host if isinstance(worker, HostedDevice) else worker, no_restart=True)
