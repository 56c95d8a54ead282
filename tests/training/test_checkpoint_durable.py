"""Durable checkpoints (issue 11): a kill during any write of a checkpoint loses nothing, resume
takes the newest complete checkpoint and cuts the logs back, retention keeps N.

The kills are real: `poise train` runs as a subprocess and SIGKILLs itself at a chosen write through
the fault tests' injector (tests/fault_injection.py, `checkpoint=<model|optimizer|state|marker>:<step>`),
which the subprocess loads through POISE_FAULTS (poise/injection.py).
Runs start from the session's SFT warm start, so every step moves the weights (asserted) and a
byte-identical final checkpoint means the same training.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from poise.config import load_train_config
from poise.errors import PoiseError
from poise.rundir import truncate_logs
from poise.injection import ENV as FAULTS_ENV
from poise.training.checkpoint import latest_checkpoint
from poise.training.colocated import train_colocated

from fault_injection import CHECKPOINT_ENV, LOAD_FROM_ENVIRONMENT  # tests/fault_injection.py

STEPS = 6
FAST = [
    "pipeline.mode=colocated",
    "run.progress=false",
    "run.log_tokens=true",
    "run.checkpoint_every=1",
    f"run.steps={STEPS}",
    "cluster.threads_per_device=1",
    "algorithm.prompts_per_step=4",
    "algorithm.group_size=4",
    "algorithm.micro_batch_size=3",
    "algorithm.sampling.max_new_tokens=12",
    "rollout.num_slots=8",
]


def _overrides(run_dir: Path, warm_start, *extra: str) -> list[str]:
    return [*FAST, *warm_start.overrides, f"run.dir={run_dir}", *extra]


def _poise_train(args: list[str], kill_at: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **{FAULTS_ENV: LOAD_FROM_ENVIRONMENT, CHECKPOINT_ENV: kill_at})
    return subprocess.run([sys.executable, "-m", "poise", "train", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def _partial(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob(".tmp-*"))


def _saved_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step_*"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, warm_start, read_run):
    run_dir = tmp_path_factory.mktemp("durable") / "reference"
    train_colocated(load_train_config(None, _overrides(run_dir, warm_start)))
    ref = read_run(run_dir)
    ref.assert_learned(warm_start)
    return ref


def _assert_same_final_and_clean(run_dir: Path, reference, read_run, warm_start) -> None:
    run = read_run(run_dir)  # a replayed step's samples must equal its first run's
    run.assert_learned(warm_start)
    run.assert_bitwise_equal(reference, "killed and resumed vs uninterrupted")
    for name in ("model.safetensors", "optimizer.safetensors"):
        assert run.digest(STEPS, name) == reference.digest(STEPS, name), name
    assert _partial(run_dir) == []
    assert (run_dir / "checkpoints/latest").read_text() == f"step_{STEPS:06d}\n"
    # the logs were cut back at each resume: every step and every sample logged once
    assert [r["step"] for r in run.rows] == list(range(STEPS))
    assert [e["step"] for e in run.events if e["kind"] == "step"] == list(range(STEPS))
    ids = [tuple(e["id"]) for e in run.events if e["kind"] == "sample"]
    assert len(ids) == len(set(ids)) == STEPS * 16


def test_sigkill_during_each_checkpoint_write_then_resume_is_byte_identical(tmp_path, reference, warm_start,
                                                                             read_run):
    run_dir = tmp_path / "killed"
    # each stage is killed while writing checkpoint `step`; the previous complete one is `step - 1`
    # (for `marker` the checkpoint itself is complete: renamed, the marker not yet replaced)
    stages = [("model", 2, 1), ("optimizer", 3, 2), ("state", 4, 3), ("marker", 5, 5)]
    for i, (write, step, newest) in enumerate(stages):
        args = _overrides(run_dir, warm_start) if i == 0 else ["--resume", str(run_dir)]
        out = _poise_train(args, f"{write}:{step}")
        assert out.returncode == -signal.SIGKILL, (write, out.returncode, out.stderr[-2000:])
        partial = ".tmp-latest-" if write == "marker" else f".tmp-step_{step:06d}-"
        assert [p for p in _partial(run_dir) if p.startswith(partial)], (write, _partial(run_dir))
        assert max(_saved_steps(run_dir)) == (step if write == "marker" else step - 1)
        assert latest_checkpoint(run_dir).name == f"step_{newest:06d}", write
        if write == "marker":
            assert (run_dir / "checkpoints/latest").read_text() == f"step_{step - 1:06d}\n"  # not replaced
    # and the marker torn as well: resume scans for the newest complete checkpoint
    (run_dir / "checkpoints/latest").write_text("step_00")
    train_colocated(load_train_config(run_dir / "config.yaml", [f"run.dir={run_dir}"]), resume=True)
    _assert_same_final_and_clean(run_dir, reference, read_run, warm_start)


def _interrupted_copy(reference, tmp_path: Path, name: str) -> Path:
    """The reference run as a kill before its last checkpoint would have left it."""
    run_dir = tmp_path / name
    shutil.copytree(reference.run_dir, run_dir)
    shutil.rmtree(run_dir / "checkpoints" / f"step_{STEPS:06d}")
    return run_dir


def test_resume_from_an_empty_marker_and_torn_log_lines(tmp_path, reference, warm_start, read_run, capsys):
    run_dir = _interrupted_copy(reference, tmp_path, "empty-marker")
    (run_dir / "checkpoints/latest").write_text("")
    # a half-written last line in both logs, as a kill mid-write leaves them
    with open(run_dir / "events.jsonl", "a") as f:
        f.write('{"t": 1.5, "kind": "sample", "id": [5, 0')
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "reward_me')
    train_colocated(load_train_config(run_dir / "config.yaml", [f"run.dir={run_dir}"]), resume=True)
    _assert_same_final_and_clean(run_dir, reference, read_run, warm_start)
    assert "warning" not in capsys.readouterr().err  # step_000005 is complete: nothing to warn about


def test_resume_falls_back_past_a_torn_checkpoint(tmp_path, reference, warm_start, read_run, capsys):
    run_dir = _interrupted_copy(reference, tmp_path, "torn")
    torn = run_dir / "checkpoints" / f"step_{STEPS - 1:06d}" / "optimizer.safetensors"
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])  # what a lost write-back leaves
    train_colocated(load_train_config(run_dir / "config.yaml", [f"run.dir={run_dir}"]), resume=True)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and f"step_{STEPS - 1:06d} is incomplete" in warnings[0], warnings
    assert f"resuming from step_{STEPS - 2:06d}" in warnings[0] and "optimizer.safetensors" in warnings[0]
    _assert_same_final_and_clean(run_dir, reference, read_run, warm_start)


@pytest.mark.parametrize("marker", ["../..", "/etc", "../../outside", "step_000001/../../..", "link"])
def test_marker_outside_checkpoints_is_refused(tmp_path, marker):
    root = tmp_path / "run" / "checkpoints"
    (root / "step_000001").mkdir(parents=True)
    (root / "link").symlink_to(tmp_path)  # inside by name, outside in fact
    (root / "latest").write_text(marker + "\n")
    with pytest.raises(PoiseError) as err:
        latest_checkpoint(tmp_path / "run")
    message = str(err.value)  # the marker's content is never printed: it may be another file's
    assert "\n" not in message and repr(marker) not in message and "outside" in message, message


@pytest.mark.parametrize("marker", ["", "step_00", "\0" * 12, "step_000009\n"])
def test_empty_torn_or_stale_marker_costs_only_a_scan(tmp_path, marker):
    run_dir = tmp_path / "run"
    _fake_checkpoint(run_dir, 1)
    _fake_checkpoint(run_dir, 2)
    (run_dir / "checkpoints/latest").write_text(marker)
    assert latest_checkpoint(run_dir).name == "step_000002"
    (run_dir / "checkpoints/latest").unlink()
    assert latest_checkpoint(run_dir).name == "step_000002"


def _fake_checkpoint(run_dir: Path, step: int) -> Path:
    """A checkpoint that verifies: what verify_checkpoint reads, without a model behind it."""
    path = run_dir / "checkpoints" / f"step_{step:06d}"
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    for name in ("model.safetensors", "optimizer.safetensors"):
        save_file({"w": torch.zeros(3)}, str(path / name))
    sizes = {name: (path / name).stat().st_size for name in ("config.json", "model.safetensors",
                                                              "optimizer.safetensors")}
    (path / "state.json").write_text(json.dumps({"step": step, "weights_version": step, "torch_rng": [],
                                                 "files": sizes}))
    return path


def test_no_complete_checkpoint_is_one_line(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    (root / "step_000001").mkdir(parents=True)
    (root / "step_000001" / "state.json").write_text('{"step": 1')
    (root / ".tmp-step_000002-123").mkdir()
    with pytest.raises(PoiseError, match="no complete checkpoint") as err:
        latest_checkpoint(tmp_path / "run")
    assert "\n" not in str(err.value) and "step_000001" in str(err.value)


def test_keep_checkpoints_leaves_the_newest_n(tmp_path):
    steps = 20
    run_dir = tmp_path / "keep"
    cfg = load_train_config(None, ["pipeline.mode=colocated", "run.progress=false", f"run.dir={run_dir}",
                                   f"run.steps={steps}", "run.checkpoint_every=1", "run.keep_checkpoints=3",
                                   "cluster.threads_per_device=1", "algorithm.prompts_per_step=2",
                                   "algorithm.group_size=2", "algorithm.sampling.max_new_tokens=4",
                                   "model.tiny.hidden_size=32", "model.tiny.intermediate_size=64",
                                   "model.tiny.num_layers=1", "model.tiny.max_positions=64"])
    train_colocated(cfg)
    entries = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert entries == ["latest", "step_000018", "step_000019", "step_000020"], entries
    assert latest_checkpoint(run_dir).name == "step_000020"


def test_truncate_logs_cuts_back_to_the_step_and_drops_a_torn_line(tmp_path):
    rows = [{"step": s, "reward_mean": 0.5} for s in range(4)]
    events = [{"t": 0.1, "kind": "sample", "id": [s, 0, 0], "step": s} for s in range(4)]
    events.insert(2, {"t": 0.2, "kind": "decision", "what": "resize"})  # no step: kept
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "rew')
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + '{"t": 0.9, "ki')
    truncate_logs(tmp_path, 2)
    kept = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in kept] == [0, 1]
    kept = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e.get("step") for e in kept] == [0, 1, None]
    assert list(tmp_path.glob(".tmp-*")) == []
    # a broken line in the middle is not a torn write: refused in one line naming file:line
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\nnot json\n{"step": 1}\n')
    with pytest.raises(PoiseError, match=r"metrics.jsonl:2 is not JSON"):
        truncate_logs(tmp_path, 1)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 0}\nnot json\n{"step": 1}\n'  # untouched
    assert list(tmp_path.glob(".tmp-*")) == []
