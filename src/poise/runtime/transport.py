"""Point-to-point transport of tensors between devices, decided once per communicator backend and
tensor device (`transport_for`), so no call site asks which mode it runs in.

Where devices share a GPU (`cluster.gpus_per_device < 1`) the job's collectives run on gloo
(runtime/cluster.py `collective_backend`: NCCL refuses two ranks on one GPU). gloo's broadcast,
all-reduce and all-gather take CUDA tensors (they go through the host inside gloo), but its
send and recv take CPU tensors only: every point-to-point transfer of a CUDA tensor is staged
through a pinned host buffer of its own, copied there before a send and back after a receive
(`HostStaged`). Between separate GPUs (NCCL) and on CPU (gloo) tensors go as they are (`Direct`).

The staging path is the same code for a CPU tensor: tests ask for `HostStaged` explicitly to run
it on a machine without a GPU.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist


class Work(Protocol):
    """An asynchronous transfer: `wait()` returns once the tensor may be read (receive) or reused
    (send)."""

    def wait(self) -> object: ...


class Transport(Protocol):
    """send/recv/isend/irecv with torch.distributed's meaning; `group=None`: the default group."""

    staged: bool

    def send(self, tensor: torch.Tensor, dst: int, group=None) -> None: ...

    def recv(self, tensor: torch.Tensor, src: int, group=None) -> None: ...

    def isend(self, tensor: torch.Tensor, dst: int, group=None) -> Work: ...

    def irecv(self, tensor: torch.Tensor, src: int, group=None) -> Work: ...


class Direct:
    """The tensor itself goes to the backend (NCCL between GPUs; gloo on CPU)."""

    staged = False

    def send(self, tensor: torch.Tensor, dst: int, group=None) -> None:
        dist.send(tensor, dst=dst, group=group)

    def recv(self, tensor: torch.Tensor, src: int, group=None) -> None:
        dist.recv(tensor, src=src, group=group)

    def isend(self, tensor: torch.Tensor, dst: int, group=None) -> Work:
        return dist.isend(tensor, dst=dst, group=group)

    def irecv(self, tensor: torch.Tensor, src: int, group=None) -> Work:
        return dist.irecv(tensor, src=src, group=group)


class HostStaged:
    """Each transfer through a host buffer of its own (pinned for a CUDA tensor): a send copies the
    tensor there first (a blocking copy: the device's queued writes to it are done), a receive
    lands there and is copied into the tensor when it is waited on. One buffer per transfer in
    flight, freed with it: never a second copy of what is not moving."""

    staged = True

    def __init__(self) -> None:
        self.staged_bytes = 0  # host bytes that went through staging buffers (sent and received)

    def host_buffer(self, like: torch.Tensor) -> torch.Tensor:
        self.staged_bytes += like.numel() * like.element_size()
        return torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=like.is_cuda)

    def _outgoing(self, tensor: torch.Tensor) -> torch.Tensor:
        host = self.host_buffer(tensor)
        host.copy_(tensor)  # device -> host waits for the stream's writes to `tensor`
        return host

    def send(self, tensor: torch.Tensor, dst: int, group=None) -> None:
        dist.send(self._outgoing(tensor), dst=dst, group=group)

    def recv(self, tensor: torch.Tensor, src: int, group=None) -> None:
        host = self.host_buffer(tensor)
        dist.recv(host, src=src, group=group)
        tensor.copy_(host)

    def isend(self, tensor: torch.Tensor, dst: int, group=None) -> Work:
        host = self._outgoing(tensor)
        return _StagedWork(dist.isend(host, dst=dst, group=group), host, None)

    def irecv(self, tensor: torch.Tensor, src: int, group=None) -> Work:
        host = self.host_buffer(tensor)
        return _StagedWork(dist.irecv(host, src=src, group=group), host, tensor)


class _StagedWork:
    """A staged transfer in flight: holds its host buffer until it is done; a receive's `wait`
    copies the buffer into the tensor it was for."""

    def __init__(self, work, host: torch.Tensor, into: torch.Tensor | None) -> None:
        self.work, self.host, self.into = work, host, into

    def wait(self) -> bool:
        self.work.wait()
        if self.into is not None:
            self.into.copy_(self.host)
            self.into = None
        self.host = None
        return True


def transport_for(backend: str, device: torch.device) -> Direct | HostStaged:
    """The point-to-point transport of a group on `backend` ('gloo', 'nccl') for tensors on
    `device`: staged through host memory exactly where gloo would be handed a CUDA tensor."""
    if backend == "gloo" and device.type == "cuda":
        return HostStaged()
    return Direct()
