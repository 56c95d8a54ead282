"""A device's generation memory follows its role: a train device holds no KV cache, a rollout
device builds it when it first generates, and a live switch to train frees it, as the resident
memory of the device's process shows (a real worker actor, the tiny model, gloo). A train device
of `cluster.shard: full` starts with its own run of the weights alone."""

from __future__ import annotations

import dataclasses

import pytest

from poise.config import load_train_config
from poise.runtime.cluster import rendezvous_key
from poise.runtime.worker import WorkerSpec, start_devices
from poise.types import Request

pytestmark = pytest.mark.ray


def _rss_of(pid: int) -> int:
    import os

    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_switch_to_train_frees_the_kv_cache(ray_session, tmp_path):
    cfg = load_train_config(None, ["cluster.devices=2", f"run.dir={tmp_path}", "model.tiny.max_positions=1024",
                                   "model.tiny.num_layers=4", "model.tiny.num_kv_heads=4"])
    rollout = dataclasses.replace(cfg.rollout, num_slots=32, max_context=1024)  # 4 layers x 33 x 4 x 1024 x 32 x 8 B
    spec = WorkerSpec(cfg.model, cfg.data.tokenizer, cfg.algorithm, rollout, 0, 1, True, "cpu")
    [device] = start_devices([0], lambda i: "DEFAULT", 1, 1, rendezvous_key(), spec, num_cpus=0)
    try:
        pid = ray_session.get(device.process_id.remote(), timeout=120)
        ray_session.get(device.set_role.remote("train"))
        assert ray_session.get(device.generation_bytes.remote()) == 0  # a train device: no cache, no noise table
        ray_session.get(device.set_role.remote("rollout"))
        ray_session.get(device.submit.remote([Request((0, i, 0), [1, 5 + i, 7]) for i in range(4)], 4))
        done = []
        while len(done) < 4:
            done += ray_session.get(device.take.remote(30.0))[0]
        cache = ray_session.get(device.generation_bytes.remote())
        assert cache > 32 * 2**20
        rollout_rss = _rss_of(pid)
        assert ray_session.get(device.abort_generation.remote()) == ([], [], [])
        ray_session.get(device.become.remote("train", 0))
        assert ray_session.get(device.generation_bytes.remote()) == 0
        assert rollout_rss - _rss_of(pid) > cache * 3 // 4, "the switch to train left the KV cache resident"
    finally:
        ray_session.kill(device)


def test_full_shard_train_devices_start_with_their_own_run_of_the_weights(ray_session, warm_start, tmp_path):
    """cluster.shard=full from a checkpoint directory: each train device reads only its run of the
    weights at start-up (the others keep their shapes with no storage); together the two hold
    every weight once, and their collective digest is the checkpoint's."""
    from poise.model.loading import load_model
    from poise.training.state.digest import weights_digest

    cfg = load_train_config(None, ["cluster.devices=2", f"run.dir={tmp_path}", *warm_start.overrides])
    whole = load_model(warm_start.path)
    total = sum(p.numel() * p.element_size() for p in whole.parameters())
    spec = WorkerSpec(cfg.model, cfg.data.tokenizer, cfg.algorithm, cfg.rollout, 0, 1, True, "cpu", shard="full",
                      train_ranks=(0, 1))
    devices = start_devices([0, 1], lambda i: "DEFAULT", 1, 2, rendezvous_key(), spec, num_cpus=0)
    try:
        held = ray_session.get([d.parameter_bytes.remote() for d in devices], timeout=180)
        assert sum(held) == total and all(0 < h < total for h in held), (held, total)
        digests = ray_session.get([d.weights_digest.remote() for d in devices], timeout=120)
        assert digests[0] == weights_digest(whole) and digests[1] is None, digests
        assert ray_session.get([d.parameter_bytes.remote() for d in devices]) == held  # the digest kept nothing
    finally:
        for d in devices:
            ray_session.kill(d)
