"""Emulated devices that share a Ray actor process (runtime/worker.py DeviceHost): each keeps the
call order and the independence an actor of its own gives it."""

import dataclasses

import pytest

from poise.config import load_train_config
from poise.runtime.cluster import rendezvous_key
from poise.runtime.emulated import Emulation
from poise.runtime.hosting import HostedDevice
from poise.runtime.worker import WorkerSpec, start_devices

pytestmark = pytest.mark.ray


def _spec(tmp_path) -> WorkerSpec:
    cfg = load_train_config(None, ["cluster.compute=emulated", "cluster.devices=4", f"run.dir={tmp_path}",
                                   "emulation.time_scale=0.001"])
    em = Emulation.from_config(cfg)
    return WorkerSpec(cfg.model, cfg.data.tokenizer, cfg.algorithm, cfg.rollout, 0, 1, True, "cpu", em.device_spec)


def _devices(ray, tmp_path, ranks, per_process):
    return start_devices(ranks, lambda i: "DEFAULT", per_process, len(ranks), rendezvous_key(), _spec(tmp_path),
                         num_cpus=0)


def test_devices_share_processes_as_asked_and_import_no_torch(ray_session, tmp_path):
    ray = ray_session
    devices = _devices(ray, tmp_path, list(range(5)), per_process=2)
    pids = ray.get([d.process_id.remote() for d in devices])
    assert all(isinstance(d, HostedDevice) for d in devices)
    assert pids[0] == pids[1] and pids[2] == pids[3] and len(set(pids)) == 3  # hosts of 2, 2 and 1
    assert ray.get([d.loaded_torch.remote() for d in devices]) == [False] * 5
    for d in devices[::2]:
        ray.kill(d.host)


def test_a_device_runs_its_calls_in_submission_order_and_apart_from_its_host_mates(ray_session, tmp_path):
    """A call whose argument is not ready yet holds the device's later calls (an actor's caller
    gets that from Ray), but not the other device of the same process."""
    ray = ray_session
    first, second = _devices(ray, tmp_path, [0, 1], per_process=2)

    @ray.remote
    def later(value, seconds):
        import time

        time.sleep(seconds)
        return value

    slow = first.restore_version.remote(later.remote(5, 3.0))  # Ray resolves the argument before the call (3 s: a loaded machine)
    fast = first.restore_version.remote(7)  # ready at once, but submitted after
    mate = second.restore_version.remote(3)
    done, _ = ray.wait([slow, fast, mate], num_returns=1, timeout=30)
    assert done == [mate]  # the other device did not wait for device 0's argument
    assert ray.get([slow, fast]) == [5, 7]
    assert ray.get(first.held_version.remote()) == 7  # the later call ran last
    assert ray.get(second.held_version.remote()) == 3
    ray.kill(first.host)


def test_handle_refuses_to_leave_the_driver(ray_session, tmp_path):
    import pickle

    device = HostedDevice(host=None, rank=3)
    with pytest.raises(TypeError, match="device 3"):
        pickle.dumps(device)
