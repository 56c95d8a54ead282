"""The loss variants on the demo task: reward gain and wall time per variant, over seeds.

    .venv/bin/python benchmarks/losses.py [--seeds 0,1,2] [--steps 200]
        [--variant NAME='override ...'] ...   (default: grpo, dapo, dr_grpo, gspo)

Each cell is one `poise train configs/demo.yaml run.seed=S run.steps=N <overrides>` in its own
process (the warm start present: it is made once, before the first cell). Cells run seed by seed,
the variants interleaved inside each seed, so the machine's noise falls on every variant alike.
Gain = mean reward of the last 5 steps minus the first 5; extra columns come from metrics.jsonl
where a variant logs them (dynamic sampling's dropped groups and extra generation).
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
    for key in ("dynamic/dropped_groups", "dynamic/extra_samples"):
        if key in rows[0]:
            cell[key] = sum(r[key] for r in rows)
    cell["samples"] = sum(r.get("samples", 0) for r in rows)
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
    write_results("losses", {"args": vars(args), "variants": summary})


if __name__ == "__main__":
    main()
