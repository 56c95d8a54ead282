"""A full disk while a train device saves a checkpoint (the disaggregated runtime): the run stops with
one line and exit status 2 (the device's CheckpointSaveError, not Ray's traceback), the devices are
released, and the previous checkpoint is intact. The disk is a tmpfs sized for one checkpoint and a
half (root only)."""

import os
import shutil
import subprocess

import pytest

from poise.config import load_train_config
from poise.errors import PoiseError
from poise.runtime.driver import train_disaggregated
from poise.training.checkpoint import CheckpointSaveError, latest_checkpoint

from fault_runs import config

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def sizes(ray_session, tmp_path_factory, warm_start) -> tuple[int, int]:
    """(bytes of a finished one-step run's files, bytes of its one checkpoint): the job both tests
    fill a disk with, run once for the module."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("cannot mount a tmpfs here (not root); tests/training/test_checkpoint_verified.py injects ENOSPC")
    sizing = tmp_path_factory.mktemp("full-disk") / "sizing"
    train_disaggregated(config(sizing, warm_start, "run.steps=1", "cluster.split=[1,1]", "cluster.devices=2"))
    used = sum(p.stat().st_size for p in sizing.rglob("*") if p.is_file())
    one = sum(p.stat().st_size for p in (sizing / "checkpoints" / "step_000001").iterdir())
    return used, one


def test_a_full_disk_during_a_device_save_is_one_line(ray_session, tmp_path, warm_start, sizes):
    used, one = sizes
    disk = tmp_path / "disk"
    disk.mkdir()
    size = used + one // 2 + (256 << 10)  # the run's files and one checkpoint fit; a second does not
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)]).returncode != 0:
        pytest.skip("mount refused a tmpfs here; tests/training/test_checkpoint_verified.py injects ENOSPC")
    try:
        run_dir = disk / "run"
        with pytest.raises(PoiseError) as err:
            train_disaggregated(config(run_dir, warm_start, "run.steps=3", "cluster.split=[1,1]",
                                       "cluster.devices=2"))
        assert isinstance(err.value, CheckpointSaveError), repr(err.value)[:2000]
        assert str(err.value) == (f"disk full while saving step 2; step 1 is intact; free space and --resume "
                                  f"{run_dir.resolve()}")
        assert err.value.exit_code == 2
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step_000001"]
        assert latest_checkpoint(run_dir).name == "step_000001"
    finally:
        subprocess.run(["umount", "-l", str(disk)])


def test_a_smaller_keep_checkpoints_on_resume_frees_the_full_disk(ray_session, tmp_path, warm_start, sizes):
    """A disk with room for two checkpoints: keeping all, the save of step 3 fails; resumed with
    run.keep_checkpoints=1 the run deletes step 1 before its save needs the room (never step 2, which
    it resumed from) and finishes, keeping step 3 alone."""
    used, one = sizes
    disk = tmp_path / "disk"
    disk.mkdir()
    size = used + one + one // 2 + (256 << 10)  # the run's files and two checkpoints fit; a third does not
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)]).returncode != 0:
        pytest.skip("mount refused a tmpfs here; tests/training/test_checkpoint_verified.py injects ENOSPC")
    try:
        run_dir = disk / "run"
        with pytest.raises(CheckpointSaveError, match="disk full while saving step 3; step 2 is intact"):
            train_disaggregated(config(run_dir, warm_start, "run.steps=3", "cluster.split=[1,1]",
                                       "cluster.devices=2"))
        assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_000001", "step_000002"]
        train_disaggregated(load_train_config(run_dir / "config.yaml", [f"run.dir={run_dir}",
                                                                       "run.keep_checkpoints=1"]), resume=True)
        assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_000003"]
        assert latest_checkpoint(run_dir).name == "step_000003"
    finally:
        subprocess.run(["umount", "-l", str(disk)])
