"""Reward functions by import path, combined by weight, through the sandbox; bad import paths fail
with one line before any work."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from poise.config import load_train_config
from poise.errors import ConfigError
from poise.rewards.scorer import RewardInput, reward_metrics

from conftest import inputs

CONSTANT = '''
def constant(prompts, completions, **kwargs):
    return [0.25 for _ in completions]

def length(prompts, completions, answer):  # no **kwargs: gets only the columns it names
    return [float(len(c)) - len(a) for c, a in zip(completions, answer)]

score = 3  # not a function
'''


def test_weighted_sum_and_per_function_metrics(make_scorer, reward_file):
    path = reward_file(CONSTANT)
    scorer = make_scorer([{"fn": "exact", "weight": 1.0}, {"fn": "items", "weight": 0.5},
                          {"fn": f"{path}:constant", "weight": -2.0}, {"fn": f"{path}:length", "name": "len"}])
    batch = [RewardInput((0, 0, 0), "sort 2 1", "1 2", {"answer": "1 2", "reward_kind": "items", "tests": []}),
             RewardInput((0, 0, 1), "sort 2 1", "1 3 4", {"answer": "1 2", "reward_kind": "items", "tests": []})]
    a, b = scorer.score(batch)
    assert a.parts == {"exact": 1.0, "items": 1.0, "constant": 0.25, "len": 0.0}
    assert b.parts == {"exact": 0.0, "items": 1 / 3, "constant": 0.25, "len": 2.0}
    assert a.value == 1.0 + 0.5 * 1.0 - 2.0 * 0.25 + 0.0
    assert b.value == 0.0 + 0.5 / 3 - 2.0 * 0.25 + 2.0
    assert reward_metrics([a, b]) == {"reward/exact": 0.5, "reward/items": (1 + 1 / 3) / 2, "reward/constant": 0.25,
                                      "reward/len": 1.0, "reward_failures": 0}


def test_rewards_do_not_depend_on_batching(make_scorer, reward_file):
    """Each sample is its own call: the same samples get the same rewards whatever their batches."""
    path = reward_file('''
def batch_size(prompts, completions, **kwargs):
    return [float(len(completions)) + len(c) for c in completions]
''')
    scorer = make_scorer([{"fn": f"{path}:batch_size"}, "math"])
    batch = [RewardInput((0, i, 0), "q", f"#### {i}" + "x" * i, {"answer": "#### 3"}) for i in range(7)]
    whole = scorer.score(batch)
    pieces = [r for start in (0, 1, 4) for r in scorer.score(batch[start:{0: 1, 1: 4, 4: 7}[start]])]
    pending = [scorer.submit([x]) for x in reversed(batch)]  # one at a time, out of order
    one_by_one = [p.result()[0] for p in reversed(pending)]
    assert whole == pieces == one_by_one
    assert [r.parts["batch_size"] for r in whole] == [1.0 + len(f"#### {i}" + "x" * i) for i in range(7)]
    assert [r.parts["math"] for r in whole] == [1.0 if i == 3 else 0.0 for i in range(7)]


def test_code_reward_runs_inside_the_sandbox(make_scorer):
    scorer = make_scorer(["code"], timeout_s=20)
    program = "```python\ndef sq(x):\n    return x * x\n```"
    tests = ["assert sq(2) == 4", "assert sq(3) == 9", "assert sq(-1) == -1"]
    batch = [RewardInput((0, 0, j), "p", c, {"answer": "", "tests": tests})
             for j, c in enumerate([program, "def sq(x):\n    return 4", "import os; os.system('sleep 100')"])]
    assert [r.value for r in scorer.score(batch)] == [2 / 3, 1 / 3, 0.0]


def test_module_and_package_import_paths(make_scorer, tmp_path, monkeypatch):
    (tmp_path / "my_reward.py").write_text("def score(prompts, completions, **kw):\n    return [0.5] * len(completions)\n")
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("FACTOR = 2.0\n")
    (pkg / "rewards.py").write_text("from my_pkg import FACTOR\nfrom . import helpers\n"
                                    "def score(prompts, completions, **kw):\n"
                                    "    return [FACTOR * helpers.one() for _ in completions]\n")
    (pkg / "helpers.py").write_text("def one():\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)  # `module:function` is found from the working directory
    scorer = make_scorer([{"fn": "my_reward:score"}, {"fn": "my_pkg.rewards:score", "name": "pkg"}])
    (result,) = scorer.score(inputs(1))
    assert result.parts == {"score": 0.5, "pkg": 2.0}
    assert "my_pkg" not in sys.modules and "my_reward" not in sys.modules  # never imported in the driver


@pytest.mark.parametrize("fn, fragments", [
    ("missing.py:score", ["reward.functions[0].fn", "missing.py", "does not exist"]),
    ("no_such_module_xyz:score", ["reward.functions[0].fn", "no module named 'no_such_module_xyz'"]),
    ("{path}:absent", ["reward.functions[0].fn", "cannot be loaded in the reward sandbox", "AttributeError"]),
    ("{path}:score", ["reward.functions[0].fn", "is a int, not a function"]),
    ("{broken}:score", ["reward.functions[0].fn", "ZeroDivisionError"]),
], ids=["missing-file", "missing-module", "missing-function", "not-callable", "import-raises"])
def test_bad_import_paths_fail_at_start(make_scorer, reward_file, fn, fragments):
    path = reward_file(CONSTANT)
    broken = reward_file("x = 1 / 0\ndef score(p, c, **k):\n    return [1.0]\n", name="broken.py")
    with pytest.raises(ConfigError) as e:
        make_scorer([fn.format(path=path, broken=broken)])
    message = str(e.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def _poise(*args):
    return subprocess.run([sys.executable, "-m", "poise", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("override, fragments", [
    ("reward.functions=[{tmp}/nope.py:score]", ["reward.functions[0].fn", "does not exist"]),
    ("reward.functions=[{tmp}/r.py:absent]", ["reward.functions[0].fn", "AttributeError"]),
    ("reward.functions=[{{fn: math, weight: .inf}}]", ["reward.functions[0].weight", "finite"]),
    ("reward.functions=[gsm8k]", ["reward.functions[0].fn", "unknown built-in"]),
], ids=["missing-file", "missing-function", "weight-not-finite", "unknown-builtin"])
def test_cli_reports_a_bad_reward_in_one_line_before_any_work(tmp_path, override, fragments):
    (tmp_path / "r.py").write_text("def score(p, c, **k):\n    return [1.0] * len(c)\n")
    result = _poise("train", override.format(tmp=tmp_path), f"run.dir={tmp_path}/run", "run.progress=false",
                    "pipeline.mode=colocated")
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("poise: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert not (tmp_path / "run").exists()  # before the run directory


def test_config_round_trips_through_yaml(tmp_path):
    from poise.schema import dump

    cfg = load_train_config(None, ["reward.functions=[math, {fn: 'a.py:f', weight: 0.5, name: fmt}]",
                                   "reward.timeout_s=3"])
    dump(cfg, tmp_path / "config.yaml")
    again = load_train_config(tmp_path / "config.yaml")
    assert again.reward == cfg.reward
    assert [(f.fn, f.weight, f.label) for f in again.reward.resolved] == [("math", 1.0, "math"), ("a.py:f", 0.5, "fmt")]
    assert [f.fn for f in load_train_config(None).reward.resolved] == ["task"]  # the default


def test_a_huge_finite_reward_is_a_counted_failure_not_a_crash(make_scorer, reward_file):
    """±1e308 is finite but breaks every sum the advantages take: it scores as a failed call (fallback,
    counted), and the group's advantages stay finite."""
    from poise.algo.advantages import outcome_advantages
    path = reward_file('''
def huge(prompts, completions, **kwargs):
    return [{"prompt 0": 1e308, "prompt 1": -1e308}.get(p, 1.0) for p in prompts]
''')
    scorer = make_scorer([{"fn": f"{path}:huge"}], fallback=-0.5)
    results = scorer.score(inputs(4))
    assert [r.value for r in results] == [-0.5, -0.5, 1.0, 1.0]
    assert [len(r.failures) for r in results] == [1, 1, 0, 0]
    assert "1e+308" in results[0].failures[0].reason and "-1e+308" in results[1].failures[0].reason
    for estimator in ("grpo", "rloo", "reinforce_pp"):
        advantages = outcome_advantages(estimator, [[r.value for r in results]])[0]
        assert all(math.isfinite(a) for a in advantages) and advantages[0] < 0 < advantages[3]


@pytest.mark.parametrize("entry, key", [({"fn": "exact", "weight": 1e300}, "weight"), (None, "fallback")])
def test_a_weight_or_fallback_that_would_overflow_the_sum_is_refused(entry, key):
    from poise.config import RewardConfig, RewardFunctionConfig
    with pytest.raises(ConfigError, match=key):
        if entry is None:
            RewardConfig(fallback=-1e300)
        else:
            RewardFunctionConfig(**entry)
