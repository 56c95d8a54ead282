"""The loss variants on the demo task: reward gain and wall time per variant, over seeds.

    .venv/bin/python benchmarks/losses.py [--seeds 0,1,2] [--steps 200]
        [--variant NAME='override ...'] ...   (default: grpo, dapo, dr_grpo, gspo)

Each cell is one `poise train configs/demo.yaml run.seed=S run.steps=N <overrides>` in its own
process (the warm start present: it is made once, before the first cell). Cells run seed by seed,
the variants interleaved inside each seed, so the machine's noise falls on every variant alike.
Gain = mean reward of the last 5 steps minus the first 5 (with dynamic sampling: of every group
generated, dropped ones too), with its dropped groups, drop rate and extra generation.
Writes bench-results/losses-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results import write_results  # benchmarks/results.py

ROOT = Path(__file__).resolve().parent.parent
POISE = str(Path(sys.executable).parent / "poise")
DEFAULT = {"grpo": "algorithm.loss=grpo", "dapo": "algorithm.loss=dapo", "dr_grpo": "algorithm.loss=dr_grpo",
           "gspo": "algorithm.loss=gspo"}


def run_cell(overrides: list[str], seed: int, steps: int, out: Path) -> dict:
    cmd = [POISE, "train", "configs/demo.yaml", f"run.seed={seed}", f"run.steps={steps}", f"run.dir={out}",
           "run.progress=false", "run.checkpoint_every=0", *overrides]
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"{shlex.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    reward = [r["reward_mean"] for r in rows]
    cell = {"seed": seed, "wall_s": wall, "first5": statistics.fmean(reward[:5]), "last5": statistics.fmean(reward[-5:])}
    cell["gain"] = cell["last5"] - cell["first5"]
    if "dynamic/reward_mean_generated" in rows[0]:
        # dynamic sampling trains only groups whose rewards differ, so reward_mean (over the groups
        # trained) is not the policy's reward: the gain column uses the mean over every group generated
        generated = [r["dynamic/reward_mean_generated"] for r in rows]
        cell["trained_gain"] = cell["gain"]
        cell["first5"], cell["last5"] = statistics.fmean(generated[:5]), statistics.fmean(generated[-5:])
        cell["gain"] = cell["last5"] - cell["first5"]
        for key in ("dynamic/dropped_groups", "dynamic/draws", "dynamic/extra_samples", "dynamic/unfilled"):
            cell[key] = sum(r[key] for r in rows)
        cell["drop_rate"] = cell["dynamic/dropped_groups"] / cell["dynamic/draws"]
    return cell


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME='OVERRIDES'",
                    help="a variant and its overrides, e.g. lora='model.lora.r=8'; repeatable")
    args = ap.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant) if args.variant else DEFAULT
    seeds = [int(s) for s in args.seeds.split(",")]
    cells: dict[str, list[dict]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="poise-losses-") as tmp:
        for seed in seeds:
            for name, overrides in variants.items():
                cell = run_cell(shlex.split(overrides), seed, args.steps, Path(tmp) / f"{name}-{seed}")
                cells[name].append(cell)
                print(f"{name:<12} seed {seed}: {cell['first5']:.3f} -> {cell['last5']:.3f} ({cell['gain']:+.3f}), "
                      f"{cell['wall_s']:.0f} s", flush=True)
    print(f"\nthe demo task, {args.steps} steps, seeds {args.seeds}: gain = last 5 - first 5 steps' mean reward")
    print(f"{'variant':<12} {'gain per seed':<26} {'mean gain':>9} {'mean wall s':>11}  overrides")
    summary = {}
    for name, runs in cells.items():
        gains = [c["gain"] for c in runs]
        summary[name] = {"overrides": variants[name], "gains": gains, "mean_gain": statistics.fmean(gains),
                         "mean_wall_s": statistics.fmean(c["wall_s"] for c in runs), "cells": runs}
        print(f"{name:<12} {' '.join(f'{g:+.3f}' for g in gains):<26} {summary[name]['mean_gain']:>+9.3f} "
              f"{summary[name]['mean_wall_s']:>11.0f}  {variants[name]}")
        if "drop_rate" in runs[0]:
            rates = ", ".join(f"{c['drop_rate']:.1%}" for c in runs)
            extra = ", ".join(str(c["dynamic/extra_samples"]) for c in runs)
            print(f"{'':<12} dynamic sampling: drop rate {rates}; extra samples generated {extra}")
    write_results("losses", {"args": vars(args), "variants": summary})


if __name__ == "__main__":
    main()
