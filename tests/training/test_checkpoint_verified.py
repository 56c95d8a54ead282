"""Checkpoints verified by content, each test written as the attack or accident it stops: a flipped
byte in a tensor, a file or directory replaced by a symbolic link, a `latest` marker linked to a
secret, non-finite weights or loss, a full disk while saving.

Real runs of the tiny model in the colocated loop (a few seconds each); the full-disk run is
`poise train` on a tmpfs too small for its second checkpoint (root only; elsewhere ENOSPC is
injected into the save).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import SafetensorError
from safetensors.torch import save_file

from poise.config import load_train_config
from poise.errors import PoiseError
from poise.training import checkpoint as ckpt
from poise.training.checkpoint import (CheckpointSaveError, check_finite, latest_checkpoint, verify_checkpoint)
from poise.training.colocated import ColocatedLoop, train_colocated

TINY = ["pipeline.mode=colocated", "run.progress=false", "run.checkpoint_every=1", "cluster.threads_per_device=1",
        "algorithm.prompts_per_step=2", "algorithm.group_size=2", "algorithm.sampling.max_new_tokens=4",
        "model.tiny.hidden_size=32", "model.tiny.intermediate_size=64", "model.tiny.num_layers=1",
        "model.tiny.max_positions=64"]


def _run(run_dir: Path, steps: int, resume: bool = False):
    if resume:
        return train_colocated(load_train_config(run_dir / "config.yaml", [f"run.dir={run_dir}",
                                                                           f"run.steps={steps}"]), resume=True)
    return train_colocated(load_train_config(None, [*TINY, f"run.dir={run_dir}", f"run.steps={steps}"]))


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory) -> Path:
    """A finished 3-step run with a checkpoint after every step (copied by each test)."""
    run_dir = tmp_path_factory.mktemp("verified") / "run"
    _run(run_dir, 3)
    return run_dir


def _copy(three_steps: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(three_steps, run_dir, symlinks=True)
    return run_dir


def _step(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


def _warnings(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if "warning" in line]


def test_state_json_records_a_sha256_for_every_file_written(three_steps):
    path = _step(three_steps, 3)
    meta = json.loads((path / "state.json").read_text())
    written = sorted(p.name for p in path.iterdir() if p.name != "state.json")
    assert sorted(meta["sha256"]) == written and set(meta["files"]) <= set(written)
    assert verify_checkpoint(path) is None


def test_a_flipped_byte_in_a_tensor_resumes_from_the_previous_checkpoint_and_ends_the_same(
        three_steps, tmp_path, capsys):
    run_dir = _copy(three_steps, tmp_path)
    model = _step(run_dir, 3) / "model.safetensors"
    final = model.read_bytes()
    data = bytearray(final)
    data[-5] ^= 0x01  # one bit of the last tensor's data: the header and the size still agree
    model.write_bytes(bytes(data))
    assert latest_checkpoint(run_dir).name == "step_000002"
    (warning,) = _warnings(capsys)
    assert "step_000003" in warning and "sha256" in warning and "resuming from step_000002" in warning, warning
    shutil.rmtree(_step(run_dir, 3))  # what resume replaces anyway; the rest of the run is step 3 again
    _run(run_dir, 3, resume=True)
    assert (_step(run_dir, 3) / "model.safetensors").read_bytes() == final  # the same training


@pytest.mark.parametrize("what", ["file", "directory"])
def test_a_checkpoint_part_replaced_by_a_symlink_is_not_loaded(three_steps, tmp_path, capsys, what):
    run_dir = _copy(three_steps, tmp_path)
    if what == "file":  # another step's file, whose bytes are a valid checkpoint file
        target = _step(run_dir, 3) / "optimizer.safetensors"
        elsewhere = tmp_path / "elsewhere.safetensors"
        shutil.copy(target, elsewhere)
        target.unlink()
        target.symlink_to(elsewhere)
    else:  # the whole directory, a copy kept elsewhere
        shutil.move(_step(run_dir, 3), tmp_path / "moved")
        _step(run_dir, 3).symlink_to(tmp_path / "moved")
        with pytest.raises(PoiseError, match="outside"):  # the marker names it: refused, one line
            latest_checkpoint(run_dir)
        (run_dir / "checkpoints" / "latest").unlink()  # without the marker, the scan passes it by
    assert latest_checkpoint(run_dir).name == "step_000002"
    if what == "file":
        (warning,) = _warnings(capsys)
        assert "symbolic link" in warning, warning


def test_a_marker_linked_to_a_secret_never_prints_it(three_steps, tmp_path):
    run_dir = _copy(three_steps, tmp_path)
    secret = tmp_path / "id_rsa"
    secret.write_text("poise-test-secret-4242\n")
    marker = run_dir / "checkpoints" / "latest"
    marker.unlink()
    marker.symlink_to(secret)
    with pytest.raises(PoiseError) as err:
        latest_checkpoint(run_dir)
    assert "poise-test-secret" not in str(err.value) and "symbolic link" in str(err.value)
    assert "\n" not in str(err.value)
    marker.unlink()
    marker.write_text(str(secret) + "\n")  # a marker naming the secret by path: refused, not echoed
    with pytest.raises(PoiseError) as err:
        latest_checkpoint(run_dir)
    assert str(secret) not in str(err.value)


def test_non_finite_weights_with_a_valid_hash_are_not_resumed(three_steps, tmp_path, capsys):
    run_dir = _copy(three_steps, tmp_path)
    path = _step(run_dir, 3)
    from safetensors.torch import load_file
    weights = load_file(str(path / "model.safetensors"))
    name = sorted(weights)[0]
    weights[name][0] = float("nan")
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    meta = json.loads((path / "state.json").read_text())
    meta["sha256"] = ckpt.file_digests(path)  # written so, not corrupted after
    meta["files"]["model.safetensors"] = (path / "model.safetensors").stat().st_size
    (path / "state.json").write_text(json.dumps(meta))
    assert latest_checkpoint(run_dir).name == "step_000002"
    (warning,) = _warnings(capsys)
    assert "non-finite" in warning and name in warning, warning


def test_a_non_finite_loss_stops_the_run_naming_the_step_before_any_save(tmp_path, monkeypatch):
    train = ColocatedLoop.train

    def nan_at_step_1(self, samples, advantages):
        stats = train(self, samples, advantages)
        return {**stats, "loss": float("nan")} if samples[0].sample_id[0] == 1 else stats

    monkeypatch.setattr(ColocatedLoop, "train", nan_at_step_1)
    run_dir = tmp_path / "run"
    with pytest.raises(PoiseError) as err:
        _run(run_dir, 3)
    message = str(err.value)
    assert message.startswith("step 1: the loss is nan") and "step 1 is intact" in message, message
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step_000001"]
    with pytest.raises(PoiseError, match="step 7: the grad_norm is inf"):
        check_finite(7, {"loss": 0.5, "grad_norm": float("inf")}, run_dir)
    check_finite(7, {"loss": 0.5, "grad_norm": 1.0}, run_dir)


def test_enospc_while_saving_is_one_line_and_loses_nothing(tmp_path, monkeypatch):
    """Injected (works anywhere): the optimizer file of step 2 finds the disk full part-way through
    (the streamed writer's OSError; safetensors' own error type, from the model file, takes the
    same path: test_enospc_in_the_model_file below)."""
    real = ckpt.write_tensors

    def full_at_step_2(path, entries):
        if "step_000002" in str(path):
            with open(path, "wb") as f:
                f.write(b"\0" * 100)  # part of it made it
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, entries)

    monkeypatch.setattr(ckpt, "write_tensors", full_at_step_2)
    run_dir = tmp_path / "run"
    with pytest.raises(CheckpointSaveError) as err:
        _run(run_dir, 3)
    assert str(err.value) == f"disk full while saving step 2; step 1 is intact; free space and --resume {run_dir}"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step_000001"]
    assert latest_checkpoint(run_dir).name == "step_000001"


def test_enospc_in_the_model_file_is_one_line_too(tmp_path, monkeypatch):
    """safetensors reports a full disk in its own error type, the OS error in its message only."""
    import safetensors.torch

    real = safetensors.torch.save_file

    def full_at_step_2(tensors, filename, metadata=None):
        if "step_000002" in str(filename):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", full_at_step_2)
    run_dir = tmp_path / "run"
    with pytest.raises(CheckpointSaveError) as err:
        _run(run_dir, 3)
    assert str(err.value) == f"disk full while saving step 2; step 1 is intact; free space and --resume {run_dir}"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step_000001"]


def _mount_tmpfs(where: Path, size: int) -> bool:
    where.mkdir(parents=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    return out.returncode == 0


def test_poise_train_on_a_full_tmpfs_says_one_line_exits_2_and_resumes(three_steps, tmp_path):
    size = sum(p.stat().st_size for p in _step(three_steps, 1).iterdir())
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, 2 * size):  # the config, logs and one checkpoint fit; the second does not
        pytest.skip("cannot mount a tmpfs here (not root): test_enospc_while_saving_is_one_line covers it")
    try:
        run_dir = disk / "run"
        out = subprocess.run([sys.executable, "-m", "poise", "train", *TINY, f"run.dir={run_dir}", "run.steps=3"],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 2, out.stderr[-3000:]
        lines = out.stderr.strip().splitlines()
        assert lines[-1] == (f"poise: error: disk full while saving step 2; step 1 is intact; free space and "
                             f"--resume {run_dir}"), out.stderr[-3000:]
        assert "Traceback" not in out.stderr
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step_000001"]
        assert verify_checkpoint(_step(run_dir, 1)) is None
        moved = tmp_path / "bigger" / "run"  # "free space": the run moves to a disk with room
        shutil.copytree(run_dir, moved)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    out = subprocess.run([sys.executable, "-m", "poise", "train", "--resume", str(moved)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for name in ("model.safetensors", "optimizer.safetensors"):  # the same training as the straight run
        assert (_step(moved, 3) / name).read_bytes() == (_step(three_steps, 3) / name).read_bytes(), name


def test_a_smaller_keep_checkpoints_on_resume_frees_the_room_its_save_needs(tmp_path, monkeypatch):
    """A disk with room for two checkpoints (ENOSPC injected while two are on it): keeping all, the
    save of step 3 fails; resuming with run.keep_checkpoints=1 must delete the old ones before its
    save needs their room, never after, and never the one it resumed from."""
    run_dir = tmp_path / "run"
    real = ckpt.write_tensors

    def two_fit(path, entries):
        if len(list((run_dir / "checkpoints").glob("step_*"))) >= 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, entries)

    monkeypatch.setattr(ckpt, "write_tensors", two_fit)
    with pytest.raises(CheckpointSaveError, match="disk full while saving step 3; step 2 is intact"):
        _run(run_dir, 3)
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_000001", "step_000002"]
    train_colocated(load_train_config(run_dir / "config.yaml", [f"run.dir={run_dir}", "run.steps=4",
                                                               "run.keep_checkpoints=1"]), resume=True)
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_000004"]
    assert latest_checkpoint(run_dir).name == "step_000004"


def test_prune_before_a_save_keeps_the_newest_checkpoint_and_the_marked_one(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 5, 9):
        (root / f"step_{step:06d}").mkdir(parents=True)
    (root / "latest").write_text("step_000002\n")  # the last completed save, older than a stray step_5
    assert ckpt.prune_before_save(tmp_path, keep=0, step=9) == []  # 0: keep all
    deleted = ckpt.prune_before_save(tmp_path, keep=1, step=9)
    assert [p.name for p in deleted] == ["step_000001"]  # step_9 is the one being saved (replaced)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000002", "step_000005", "step_000009"]
    (root / "latest").write_text("step_000005\n")
    assert [p.name for p in ckpt.prune_before_save(tmp_path, keep=1, step=9)] == ["step_000002"]
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000005", "step_000009"]
