"""The core is torch-free (docs/design.md, Layers): config, types, policy, sim, the run directory and
emulated compute import and run with torch and transformers blocked, and an emulated job's worker
actors never import torch (each would pay ~120 MB for it: benchmarks/emulated_memory.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from blocker import blocker_source  # tests/blocker.py

BLOCKER = blocker_source("torch", "transformers")

CORE = BLOCKER + r'''
import importlib, pkgutil
import poise.config, poise.policy, poise.sim, poise.episodes
modules = ["poise.config", "poise.types", "poise.schema", "poise.runlog", "poise.rundir", "poise.metrics",
           "poise.completions", "poise.cli.completions", "poise.report.completions",
           "poise.data.prompts", "poise.data.tasks", "poise.data.tokenizer", "poise.data.dataset",
           "poise.runtime.emulated", "poise.evaluation.heldout", "poise.runtime.evaluation"]
for package in (poise.config, poise.policy, poise.sim, poise.episodes):  # every submodule, including ones added later
    modules += [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
for name in modules:
    importlib.import_module(name)

from poise.config import load_train_config
from poise.sim.scenario import load_scenario
cfg = load_train_config(None, ["cluster.compute=emulated"])
scenario = load_scenario("streamrl-pipeline")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print("MODULES", " ".join(sorted(modules)))
print("LOADED", loaded)
'''

# Installed as sitecustomize.py on PYTHONPATH: the blocker, in Ray worker processes only (the
# driver runs the trainer group, which may use torch); each worker it arms leaves a marker file.
WORKER_SITE = r'''
import os, sys
if any(a.endswith("default_worker.py") for a in sys.orig_argv):
''' + "".join("    " + line + "\n" for line in BLOCKER.strip().splitlines()) + r'''
    open(os.path.join(os.environ["POISE_TEST_MARKS"], str(os.getpid())), "w").close()
'''


def _run(args: list[str], env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_core_imports_and_loads_with_torch_blocked():
    out = _run(["-c", CORE])
    assert out.returncode == 0, out.stderr
    modules = out.stdout.split("MODULES ", 1)[1].split("\n", 1)[0].split()
    assert {"poise.policy.split", "poise.sim.driver", "poise.sim.scenario", "poise.sim.workload",
            "poise.episodes.runner", "poise.episodes.tools", "poise.config.train",
            "poise.config.policy"} <= set(modules)
    assert "LOADED []" in out.stdout


def test_blocker_really_blocks():
    # The same finder must make torch and transformers imports fail, or the tests here prove nothing.
    for name in ("torch", "transformers"):
        out = _run(["-c", BLOCKER + f"import {name}\n"])
        assert out.returncode != 0 and f"blocked import of {name}" in out.stderr


@pytest.mark.ray
def test_emulated_worker_actors_never_import_torch(tmp_path):
    site, marks = tmp_path / "site", tmp_path / "marks"
    site.mkdir()
    marks.mkdir()
    (site / "sitecustomize.py").write_text(WORKER_SITE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
               POISE_TEST_MARKS=str(marks))
    out = _run(["-m", "poise", "train", "run.progress=false", "run.steps=1", f"run.dir={tmp_path / 'run'}",
                "run.checkpoint_every=0", "cluster.compute=emulated", "cluster.devices=2", "pipeline.mode=sync",
                "algorithm.micro_batch_size=4", "emulation.time_scale=0.001",
                "emulation.overrides=[workload.prompts_per_step=2, workload.samples_per_prompt=2]"],
               env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    assert len(list(marks.iterdir())) >= 2, "the blocker armed fewer Ray workers than devices"
