"""What a vLLM engine leaves on /dev/shm when its process dies without `release` (a crash, a
killed actor) is removed by the next sweep: the directory of a dead owner and the shared-memory
segments it lists; a live owner's directory and segments no engine listed stay. vLLM itself is
not needed: the sweep reads names and pids (rollout/vllm_engine.py)."""

import subprocess
import sys

from poise.rollout.vllm_engine import sweep_stale_shm


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_dead_engines_directory_and_segments_are_swept_and_nothing_else(tmp_path):
    import os

    dead = tmp_path / f"poise-vllm-{_dead_pid()}-abc"
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"w" * 1000)
    (dead / "segments").write_text("psm_dead1\npsm_dead2\npsm_gone\n")
    live = tmp_path / f"poise-vllm-{os.getpid()}-xyz"
    live.mkdir()
    (live / "segments").write_text("psm_live\n")
    for name in ("psm_dead1", "psm_dead2", "psm_live", "psm_someone_elses"):
        (tmp_path / name).write_bytes(b"s" * 100)
    removed = sweep_stale_shm(tmp_path)
    assert sorted(removed) == sorted(["psm_dead1", "psm_dead2", dead.name]), removed
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "psm_live", "psm_someone_elses"])
