"""The collective libraries' environment a device sets before its torch.distributed world starts:
NCCL's sockets on the interface of Ray's node address, as gloo's already were, and NCCL's
asynchronous error handling in the mode that keeps a survivor alive for recovery."""

from __future__ import annotations

import datetime

import pytest

from poise.runtime.cluster import rendezvous_key
from poise.runtime.worker import join_rendezvous

pytestmark = pytest.mark.ray

VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TORCH_NCCL_ASYNC_ERROR_HANDLING")


def test_nccl_gets_the_interface_and_error_handling_beside_gloo(ray_session, monkeypatch):
    for name in VARS:
        monkeypatch.delenv(name, raising=False)
    store = join_rendezvous(0, 1, rendezvous_key(), datetime.timedelta(seconds=30))  # device 0 of a world of 1
    import os

    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"  # a local Ray is on loopback
    assert os.environ["NCCL_SOCKET_IFNAME"] == os.environ["GLOO_SOCKET_IFNAME"]
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"
    del store


def test_a_users_setting_is_kept(ray_session, monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth7")
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    join_rendezvous(0, 1, rendezvous_key(), datetime.timedelta(seconds=30))
    import os

    assert os.environ["NCCL_SOCKET_IFNAME"] == "eth7" and os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
