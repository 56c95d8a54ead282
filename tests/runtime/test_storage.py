"""Checkpoints through the driver (runtime/storage.py, issue 11 item 3).

A device actor with a real tiny model and optimizer saves through `CheckpointStore` in each mode:
with `driver`, the checkpoint is written on the device's side into a staging directory, pulled
piece by piece (pieces far smaller than the files, so every file takes several) and committed in
the driver's run.dir; its bytes equal a direct save's. Loading pushes the files to a staging
directory on the device's node, the device restores the same weights from there, and `release`
removes the copy. With `auto` on one machine the probe finds run.dir visible and the device
writes it itself.
"""

import hashlib
from pathlib import Path

import pytest
import ray

from poise.runtime import storage
from poise.runtime.storage import CheckpointStore, FileEndpoint

pytestmark = [pytest.mark.ray]


@ray.remote
class _Device(FileEndpoint):
    """A tiny model whose optimizer has taken one step (so both have state to save)."""

    def __init__(self, seed: int):
        import torch

        from poise.config import TinyModelConfig
        from poise.model.loading import build_tiny

        torch.set_num_threads(1)
        self.model = build_tiny(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                                intermediate_size=64), 40, seed)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.model(input_ids=torch.arange(8).view(1, 8)).logits.sum().backward()
        self.optimizer.step()

    def save_checkpoint(self, run_dir, step, version, extra=None):
        from poise.training.checkpoint import TrainState, save_checkpoint

        return str(save_checkpoint(run_dir, self.model, self.optimizer, TrainState(step, version), extra))

    def load_checkpoint(self, path):
        from poise.training.checkpoint import load_checkpoint

        state = load_checkpoint(Path(path), self.model, self.optimizer)
        return state.step, state.weights_version

    def digest(self):
        from poise.training.state.digest import weights_digest

        return weights_digest(self.model)


def _files(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_a_checkpoint_through_the_driver_equals_a_direct_one(ray_session, tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(storage, "CHUNK_BYTES", 4096)  # every weight file takes several pieces
    saver, other = _Device.remote(0), _Device.remote(1)
    direct = CheckpointStore(tmp_path / "direct", "shared", 60).save(0, saver, tmp_path / "direct", 3, 7)
    through = CheckpointStore(tmp_path / "through", "driver", 60)
    path = through.save(0, saver, tmp_path / "through", 3, 7, {"pending_samples.jsonl": b"{}\n"})
    assert through.pulled == 1 and path == (tmp_path / "through/checkpoints/step_000003").resolve()
    assert (tmp_path / "through/checkpoints/latest").read_text().strip() == "step_000003"
    sizes = {p.name: p.stat().st_size for p in direct.iterdir()}
    assert sizes["model.safetensors"] > 4 * 4096, sizes
    got = _files(path)
    assert got.pop("pending_samples.jsonl") == hashlib.sha256(b"{}\n").hexdigest()
    want = _files(Path(direct))
    assert got.pop("state.json") != want.pop("state.json")  # it records one more file ...
    assert got == want  # ... and every other byte is the direct save's
    assert sorted(p.name for p in path.parent.iterdir()) == ["latest", "step_000003"]  # nothing partial
    assert "go through the driver" in capfd.readouterr().err

    # the other device restores from a copy pushed to its node, and the copy goes afterwards
    assert ray.get(other.digest.remote()) != ray.get(saver.digest.remote())
    readable = through.readable(1, other, path)
    assert through.pushed == 1 and not Path(readable).is_relative_to(tmp_path)
    assert _files(Path(readable)) == _files(path)
    assert ray.get(other.load_checkpoint.remote(readable)) == (3, 7)
    assert ray.get(other.digest.remote()) == ray.get(saver.digest.remote())
    through.release()
    ray.get(other.digest.remote())  # the release calls ran before this one
    assert not Path(readable).parent.exists()


def test_auto_finds_run_dir_visible_on_the_drivers_node(ray_session, tmp_path):
    device = _Device.remote(0)
    store = CheckpointStore(tmp_path, "auto", 60)
    path = store.save(0, device, tmp_path, 1, 1)
    assert store.pulled == 0 and store.readable(0, device, path) == str(path) and store.pushed == 0
    assert not (tmp_path / storage.PROBE_FILE).exists()
    assert store.sees_run_dir(0, device)
