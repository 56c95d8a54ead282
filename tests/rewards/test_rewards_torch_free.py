"""`poise.rewards` is its own torch-free layer (docs/design.md, Layers): every module imports, and a
scorer starts and scores, with torch, transformers and ray blocked."""

from __future__ import annotations

import subprocess
import sys

from blocker import blocker_source  # tests/blocker.py

SCRIPT = blocker_source("torch", "transformers", "ray") + r'''
import importlib, pkgutil
import poise.rewards
names = [m.name for m in pkgutil.walk_packages(poise.rewards.__path__, "poise.rewards.")]
for name in names:
    importlib.import_module(name)
from poise.config import RewardConfig
from poise.rewards.scorer import RewardInput, RewardScorer
with RewardScorer(RewardConfig(functions=("math", "items"))) as scorer:
    (r,) = scorer.score([RewardInput((0, 0, 0), "q", "so #### 7", {"answer": "#### 7"})])
print("MODULES", " ".join(sorted(names)))
print("VALUE", r.value)
print("LOADED", sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
'''


def test_rewards_import_and_score_with_torch_and_ray_blocked():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    modules = set(out.stdout.split("MODULES ", 1)[1].split("\n", 1)[0].split())
    assert {"poise.rewards.builtin", "poise.rewards.sandbox", "poise.rewards.scorer", "poise.rewards.worker",
            "poise.rewards.confine", "poise.rewards.functions"} <= modules
    assert "VALUE 1.0" in out.stdout  # math 1.0 + items 0.0 (no item in its place)
    assert "LOADED []" in out.stdout
