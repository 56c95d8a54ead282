"""run.tensorboard: every number of each metrics.jsonl row becomes a TensorBoard scalar at
global_step = step (read back with tensorboard's EventAccumulator), and torch is imported for it
only when it is on."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from blocker import blocker_source  # tests/blocker.py
from poise.runlog import scalars

TINY = [
    "pipeline.mode=colocated", "run.progress=false", "run.steps=3", "run.checkpoint_every=0",
    "algorithm.prompts_per_step=2", "algorithm.group_size=2", "algorithm.micro_batch_size=4",
    "algorithm.sampling.max_new_tokens=6", "algorithm.kl_coef=0.01", "rollout.num_slots=4",
    "model.tiny.hidden_size=32", "model.tiny.intermediate_size=64", "model.tiny.num_layers=1",
    "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1", "model.tiny.max_positions=64",
]


def test_scalars_flatten_every_number_of_a_row():
    row = {"step": 4, "reward_mean": 0.5, "reward": {"math": 0.25, "format": 1}, "phases": {"rollout_s": 1.5},
           "split": [1, 1], "mode": "sync", "done": True, "grad_norm": float("nan"), "tokens": 12}
    assert dict(scalars(row)) == {"reward_mean": 0.5, "reward/math": 0.25, "reward/format": 1.0,
                                  "phases/rollout_s": 1.5, "tokens": 12.0}


def test_colocated_run_writes_a_scalar_per_metric_and_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from poise.config import load_train_config
    from poise.training.colocated import train_colocated

    run = tmp_path / "run"
    train_colocated(load_train_config(None, [*TINY, f"run.dir={run}", "run.tensorboard=true"]))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = {name for r in rows for name, _ in scalars(r)}
    # reward, response length, KL, grad norm, step phase seconds, tokens/s all among them
    assert {"reward_mean", "response_len_mean", "grad_norm", "tokens_per_s", "phases/rollout_s",
            "phases/train_s"} <= expected
    assert any("kl" in name for name in expected), sorted(expected)
    # the reward functions' own means (flat "reward/<name>" keys) and the failure count
    assert "reward_failures" in expected and any(name.startswith("reward/") for name in expected), sorted(expected)
    # the rollout/trainer log-prob mismatch of each step (Poise's engine against the trainer, fp32)
    assert {"mismatch/logp_abs_diff_mean", "mismatch/logp_abs_diff_max", "mismatch/ratio_p05", "mismatch/ratio_p50",
            "mismatch/ratio_p95"} <= expected, sorted(expected)
    assert tags == expected
    for name in expected:  # a key some rows lack (a task family absent from a step) has fewer points
        logged = [(r["step"], dict(scalars(r))[name]) for r in rows if name in dict(scalars(r))]
        points = acc.Scalars(name)
        assert [p.step for p in points] == [step for step, _ in logged], name
        for p, (_, value) in zip(points, logged):
            assert p.value == pytest.approx(value, rel=1e-6, abs=1e-6), name
    assert len(acc.Scalars("reward_mean")) == 3


def test_without_tensorboard_no_directory_and_no_torch(tmp_path):
    code = blocker_source("torch") + f"""
from poise.runlog import RunLog
with RunLog({str(tmp_path)!r}) as log:
    log.metrics({{"step": 0, "reward_mean": 1.0}})
try:
    RunLog({str(tmp_path / "tb")!r}, tensorboard=True)
except Exception as e:
    print("ERROR", type(e).__name__, e)
print("LOADED", sorted(m for m in sys.modules if m.split(".")[0] == "torch"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout
    assert "ERROR PoiseError run.tensorboard needs torch and the tensorboard package" in out.stdout
    assert not (tmp_path / "tensorboard").exists()
    assert math.isclose(json.loads((tmp_path / "metrics.jsonl").read_text())["reward_mean"], 1.0)


def test_tensorboard_shows_each_steps_completions_as_text(tmp_path):
    """With run.tensorboard, each step's completions.jsonl rows are a `completions` text at its step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from poise.completions import read_completions
    from poise.config import load_train_config
    from poise.training.colocated import train_colocated

    run = tmp_path / "run"
    train_colocated(load_train_config(None, [*TINY, f"run.dir={run}", "run.tensorboard=true"]))
    rows = read_completions(run)
    assert [r["step"] for r in rows] == [0] * 4 + [1] * 4 + [2] * 4
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    (tag,) = [t for t in acc.Tags()["tensors"] if t.startswith("completions")]
    texts = acc.Tensors(tag)
    assert [t.step for t in texts] == [0, 1, 2]
    for event in texts:
        text = event.tensor_proto.string_val[0].decode()
        for r in rows:
            if r["step"] == event.step:
                assert f"sample {'/'.join(map(str, r['id']))}" in text
                assert all(("    " + line) in text for line in r["completion"].splitlines()), (r, text)
