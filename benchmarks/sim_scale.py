"""Simulator speed at scale: 1000 steps of the 1024-GPU scenario (cluster-1024).

    .venv/bin/python benchmarks/sim_scale.py [--steps 1000] [--repeats 3]

Times `Simulation(...).run()` end to end, including the policy objects (allocator, skew-aware
dispatch with the history ranker, resize controller) and writing the run log the scenario
asks for (per-instance intervals, step and decision events, metrics) to a temporary directory.
Wall-clock on this machine; the acceptance bound is 30 s for 1000 steps.
Writes bench-results/sim_scale-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from results import write_results  # benchmarks/results.py
from poise.sim import load_scenario
from poise.sim.driver import Simulation


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    times = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            sim = Simulation(load_scenario("cluster-1024", [f"steps={args.steps}"]), tmp)
            t0 = time.perf_counter()
            s = sim.run()
            times.append(time.perf_counter() - t0)
            events = os.path.getsize(Path(tmp) / "events.jsonl")
    samples = args.steps * len(sim.workload.step(0))
    print(f"cluster-1024: {args.steps} steps, {samples:,} samples, {sim.sc.cluster.devices} devices, "
          f"{sim.split.rollout // sim.tp} rollout instances at the end")
    print(f"{'repeat':>6} {'wall s':>8}")
    for i, t in enumerate(times):
        print(f"{i:>6} {t:>8.2f}")
    print(f"median {statistics.median(times):.2f} s (bound: 30 s); {samples / statistics.median(times):,.0f} samples/s; "
          f"events.jsonl {events / 1e6:.1f} MB; virtual time {s.total_s:,.0f} s; resizes {len(s.resizes)}")
    write_results("sim_scale", {"steps": args.steps, "samples": samples, "wall_s": times,
                                "median_s": statistics.median(times), "summary": s.as_dict()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
