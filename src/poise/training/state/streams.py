"""Device-side ordering for transfers: the side stream a background transfer copies on, and the
synchronisation a timing point takes. Both are no-ops on CPU. Callers reach them through this
module (`streams.side_stream`, `streams.synchronize`), so one place decides them for every
transfer.
"""

from __future__ import annotations

import torch


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work before a time is taken: CUDA collectives and copies return
    at enqueue, so an unsynchronised time measures the launch. A no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SideStream:
    """A CUDA stream of its own for a background transfer's copies: each entry (`with`) runs after
    the work already queued on the current stream (the state it reads or the fresh state it
    fills), and `synchronize` waits for the copies it queued. A no-op on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._entered: list = []

    def __enter__(self) -> "SideStream":
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
            context = torch.cuda.stream(self.stream)
            context.__enter__()
            self._entered.append(context)
        return self

    def __exit__(self, *exc) -> None:
        if self._entered:
            self._entered.pop().__exit__(*exc)

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()


def side_stream(device: torch.device) -> SideStream:
    """A side stream for a background transfer on `device` (`SideStream`)."""
    return SideStream(device)
