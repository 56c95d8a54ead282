"""The Python API (poise/api.py): what load_config merges, and that poise.train stays callable.
The README's example, which trains and simulates, is run in tests/test_readme.py."""

import subprocess
import sys

import pytest

import poise
from poise.config import load_train_config
from poise.errors import ConfigError


def test_load_config_merges_section_overrides_key_by_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("algorithm:\n  lr: 0.0003\n  sampling:\n    top_p: 0.9\nrun:\n  steps: 3\n")
    cfg = poise.load_config(path, algorithm={"loss": "dapo", "sampling": {"max_new_tokens": 20}},
                            determinism="semantic")
    want = load_train_config(path, ["algorithm.loss=dapo", "algorithm.sampling.max_new_tokens=20",
                                    "determinism=semantic"])
    assert cfg == want
    assert (cfg.algorithm.lr, cfg.algorithm.sampling.top_p, cfg.run.steps) == (0.0003, 0.9, 3)  # kept
    assert poise.load_config({"run": {"steps": 4}}, run={"seed": 2}).run.steps == 4
    assert poise.load_config(cfg, run={"steps": 9}) == load_train_config(path, [
        "algorithm.loss=dapo", "algorithm.sampling.max_new_tokens=20", "determinism=semantic", "run.steps=9"])


def test_load_config_errors_name_the_key_and_the_poise_name():
    with pytest.raises(ConfigError, match="algorithm.beta.*algorithm.kl_coef"):
        poise.load_config(algorithm={"beta": 0.1})
    with pytest.raises(ConfigError, match="algorithm.loss"):
        poise.load_config(algorithm={"loss": "ppo"})


def test_poise_train_is_a_plain_function_once_the_training_package_is_imported():
    """`poise.train` is a function (help() documents it), not a package that a submodule import
    could rebind; import poise imports neither torch nor the config."""
    code = ("import sys, inspect, poise; assert inspect.isfunction(poise.train); "
            "assert 'torch' not in sys.modules; "
            "assert 'poise.config' not in sys.modules; import poise.training.colocated; "
            "from poise.training.trainer import PolicyTrainer; assert inspect.isfunction(poise.train); "
            "assert 'RunResult' in poise.train.__doc__; "
            "assert sorted(poise.__all__) == ['RunResult', 'load_config', 'simulate', 'train']")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_train_checks_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="clip_eps_high"):
        poise.train(run={"dir": str(tmp_path / "run")}, algorithm={"clip_eps_low": 0.3, "clip_eps_high": 0.2})
    assert not (tmp_path / "run").exists()
