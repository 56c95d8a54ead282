"""A newcomer's inputs that used to pass silently or mislead: each says what it is, in one line,
before any work (exit 2), or the run's last line says what happened."""

import subprocess
import sys

import pytest

from blocker import blocker_source  # tests/blocker.py
from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py


@pytest.mark.parametrize("command", ["simulate", "plan"])
def test_scenario_commands_given_a_training_config_say_so(command):
    assert_one_line_error(poise(command, "configs/demo.yaml"), "configs/demo.yaml", "training config",
                          "poise simulate --list")


def test_vllm_prerequisites_are_named_together(tmp_path):
    result = poise("train", "configs/demo.yaml", "rollout.backend=vllm", "model.lora.r=4",
                   "rollout.stop_strings=[x]", f"run.dir={tmp_path}/run")
    assert_one_line_error(result, "rollout.backend", "determinism=semantic", "model.lora", "rollout.stop_strings",
                          "rollout.backend=poise")
    assert not (tmp_path / "run").exists()


def test_lora_prerequisites_are_named_together(tmp_path):
    """peft blocked, dropout under bitwise and shard full: all three in the one line."""
    code = blocker_source("peft") + (
        "import sys\nfrom poise.cli import main\n"
        "sys.argv = ['poise', 'train', 'configs/demo.yaml', 'model.lora.r=4', 'model.lora.dropout=0.1', "
        f"'cluster.shard=full', 'run.dir={tmp_path}/run']\nsys.exit(main())\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert_one_line_error(result, "model.lora", "determinism: semantic", "cluster.shard=full", "poise[lora]")
    assert not (tmp_path / "run").exists()


def test_full_shard_in_colocated_mode_is_refused(tmp_path):
    result = poise("train", "configs/demo.yaml", "pipeline.mode=colocated", "cluster.shard=full",
                   "cluster.device=cuda", f"run.dir={tmp_path}/run")  # cuda: unrefused, it stops before work
    assert_one_line_error(result, "cluster.shard", "pipeline.mode=colocated", "cluster.shard=none")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("split", [["cluster.split=[3,1]"], ["cluster.devices=2", "cluster.split=[]"]])
def test_full_shard_with_one_train_device_is_explained_in_one_line(tmp_path, split):
    """Valid (a resize may add train devices), but it shards nothing: one note before the checks
    (here a cuda device on this CPU machine stops the run before any work)."""
    result = poise("train", "configs/demo.yaml", *split, "cluster.shard=full", "cluster.device=cuda",
                   f"run.dir={tmp_path}/run")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 2, result.stderr
    assert lines[0].startswith("poise: note: cluster.shard=full with one train device"), lines[0]
    assert "cluster.shard=none" in lines[0] and len(lines[0]) <= 200
    assert poise("train", "configs/demo.yaml", "cluster.split=[2,2]", "cluster.shard=full", "cluster.device=cuda",
                 f"run.dir={tmp_path}/run").stderr.count("poise: note:") == 0


@pytest.mark.parametrize("rewards, want", [
    ([0.25], "poise: 1 step in RUN; reward 0.250"),
    ([0.0, 0.5, 1.0], "poise: 3 steps in RUN; reward 0.000 (first step) -> 1.000 (last step)"),
    ([0.0] * 5 + [1.0] * 5, "poise: 10 steps in RUN; reward 0.000 (first 5) -> 1.000 (last 5)"),
])
def test_final_line_fits_the_run_length(tmp_path, monkeypatch, capsys, rewards, want):
    """The command's last line, with the training itself replaced by its metrics rows."""
    import poise.api
    from poise.cli import main

    rows = [{"step": i, "reward_mean": r} for i, r in enumerate(rewards)]
    monkeypatch.setattr(poise.api, "check_before_work", lambda cfg: None)
    monkeypatch.setattr(poise.api, "run_training", lambda cfg, resume=False: rows)
    run_dir = tmp_path / "run"
    assert main(["train", "configs/demo.yaml", f"run.dir={run_dir}"]) == 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == want.replace("RUN", str(run_dir))
