"""The GPU count is checked against what Ray detects, in one line, before any actor starts; and
devices may share a GPU (`cluster.gpus_per_device` below 1) with their collectives over gloo.

No GPU here: Ray's detection is replaced by a number, and `start_local` by a recorder, so the
test sees what a machine with that many GPUs would get. Before the fix a local Ray was told it had
`devices + reserve` GPUs whatever the machine held, so nothing failed until the actors started.
"""

from __future__ import annotations

import pytest

from poise.config import ClusterConfig, load_train_config
from poise.errors import ConfigError, PoiseError
from poise.runtime import cluster


@pytest.fixture
def local_start(monkeypatch):
    """Run `cluster.connect` as if no Ray were up, recording what it would start."""
    started: list[dict] = []
    monkeypatch.setattr(cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(cluster, "start_local", lambda **kwargs: started.append(kwargs))
    return started


def _detects(monkeypatch, gpus: int) -> None:
    monkeypatch.setattr(cluster, "detected_gpus", lambda: gpus)


def test_more_devices_than_gpus_fails_in_one_line_before_ray_starts(monkeypatch, local_start):
    _detects(monkeypatch, 1)
    with pytest.raises(PoiseError) as e:
        cluster.connect(ClusterConfig(device="cuda", devices=2, reserve_devices=1))
    message = str(e.value)
    assert "\n" not in message and "need 3 GPUs" in message and "Ray detects 1" in message
    assert "gpus_per_device=0.333" in message  # the fix that fits this machine
    assert local_start == []  # nothing started


def test_ray_counts_the_gpus_itself(monkeypatch, local_start):
    _detects(monkeypatch, 4)
    cluster.connect(ClusterConfig(device="cuda", devices=2, reserve_devices=1))
    assert len(local_start) == 1 and not local_start[0].get("num_gpus")  # never told a number of GPUs


def test_no_gpu_at_all_says_so(monkeypatch, local_start):
    _detects(monkeypatch, 0)
    with pytest.raises(PoiseError, match="Ray detects 0 .*install NVIDIA's driver or use cluster.device=cpu"):
        cluster.connect(ClusterConfig(device="cuda", devices=2))


def test_two_devices_share_one_gpu_over_gloo(monkeypatch, local_start):
    _detects(monkeypatch, 1)
    cfg = ClusterConfig(device="cuda", devices=2, gpus_per_device=0.5)
    cluster.connect(cfg)  # fits: 2 x 0.5
    assert len(local_start) == 1
    assert cluster.device_bundle(cfg) == {"GPU": 0.5, "CPU": 1}
    assert cluster.collective_backend("cuda", 0.5) == "gloo"  # NCCL refuses two ranks on one GPU
    assert cluster.collective_backend("cuda", 1.0) == "nccl"
    assert cluster.collective_backend("cpu", 1.0) == "gloo"
    with pytest.raises(PoiseError, match="need 2 GPUs"):
        cluster.connect(ClusterConfig(device="cuda", devices=3, gpus_per_device=0.5))


@pytest.mark.parametrize("value,why", [(0, r"in \(0, 1\]"), (1.5, r"in \(0, 1\]"), (0.5, "needs cluster.device=cuda")])
def test_gpus_per_device_is_validated(value, why):
    with pytest.raises(ConfigError, match=why):
        load_train_config(None, [f"cluster.gpus_per_device={value}"])


def test_the_one_gpu_config_loads_survives_its_yaml_and_needs_one_gpu(tmp_path):
    """What the loaded config does, not the value just set: written as a run's config.yaml and read
    back it is the same section, and two devices at 0.5 take one GPU in half-GPU bundles."""
    from poise.schema import dump

    cfg = load_train_config(None, ["cluster.device=cuda", "cluster.devices=2", "cluster.gpus_per_device=0.5"])
    dump(cfg, tmp_path / "config.yaml")
    again = load_train_config(tmp_path / "config.yaml", [])
    assert again.cluster == cfg.cluster
    assert cluster.gpus_needed(again.cluster) == 1
    assert cluster.device_bundle(again.cluster) == {"GPU": 0.5, "CPU": 1}


def test_gpu_checks_shared_gpu_run_is_a_valid_config():
    """benchmarks/gpu_check.sh's shared-GPU run (three devices on one GPU, a live resize) loads, needs one
    GPU and runs its collectives over gloo."""
    cfg = load_train_config(None, ["pipeline.mode=sync", "cluster.device=cuda", "cluster.devices=3",
                                   "cluster.gpus_per_device=0.33", "cluster.split=[2,1]",
                                   "resize.schedule=[{at_step: 2, split: [1, 2]}]", "resize.mode=live",
                                   "run.steps=4", "run.checkpoint_every=2"])
    assert cluster.gpus_needed(cfg.cluster) == 1
    assert cluster.collective_backend(cfg.cluster.device, cfg.cluster.gpus_per_device) == "gloo"
