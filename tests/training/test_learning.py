"""A short seeded version of the demo learns: reward rises, and beats a run that cannot learn."""

import pytest

from poise.config import load_train_config
from poise.training.colocated import train_colocated

pytestmark = pytest.mark.slow


def _run(tmp_path, name, *extra):
    cfg = load_train_config("configs/demo.yaml", [
        "run.progress=false", "pipeline.mode=colocated", "run.steps=25", f"run.dir={tmp_path / name}",
        f"model.path={tmp_path / 'warmstart'}", "model.sft.steps=300", "model.sft.batch_size=32", *extra])
    return [r["reward_mean"] for r in train_colocated(cfg)]


def test_grpo_raises_reward_over_a_control_that_cannot_learn(tmp_path):
    learner = _run(tmp_path, "learner")
    control = _run(tmp_path, "control", "algorithm.lr=1e-12")  # same prompts, same warm start
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert mean(learner[-5:]) > mean(learner[:5]) + 0.05
    assert mean(learner[-10:]) > mean(control[-10:]) + 0.05
