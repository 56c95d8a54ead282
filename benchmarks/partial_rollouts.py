"""Partial rollouts and over-provisioning on the simulator: which staleness pays on a long tail.

    .venv/bin/python benchmarks/partial_rollouts.py [--devices 16 8] [--steps 60] [--batch-cap 64]

Scenario streamrl-pipeline (a 7B-like cost model and a long-tail reasoning mix: 64 prompts x 8
samples a step, lognormal and Pareto lengths up to 16k tokens), pipeline.mode=async, each device
count with the split and batch cap the allocator picks (--batch-cap: that cap for every row). Rows: staleness 1 (one-step-off async, whole samples),
then staleness 2, 3 and 4 with pipeline.partial_tokens (the window) and pipeline.overprovision
(extra prompt groups in flight). Columns: simulated trained samples per second, the ratio to
staleness 1 on the same devices, the share of trained tokens made 2 or more weights versions
before the weights they train against, and an emulated column (`emulated_samples_per_s`: empty
until the runtime runs partial rollouts under emulated compute). Writes
bench-results/partial_rollouts-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import time

from results import write_results  # benchmarks/results.py
from poise.sim import load_scenario
from poise.sim.driver import Simulation

SCENARIO = "streamrl-pipeline"
QUIET = ["log.samples=false", "log.intervals=none"]
# (max_staleness, partial_tokens, overprovision); the first row is the baseline
CONFIGS = [(1, 0, 0), (2, 4096, 0), (2, 2048, 16), (2, 4096, 16), (2, 4096, 32), (2, 5120, 32), (2, 8192, 16),
           (3, 4096, 32), (4, 2048, 32)]


def overrides(staleness: int, window: int, extra: int) -> list[str]:
    knobs = ["pipeline.mode=async", f"pipeline.max_staleness={staleness}"]
    return knobs + ([f"pipeline.partial_tokens={window}", f"pipeline.overprovision={extra}"] if window else [])


def emulated_samples_per_s(devices: int, split: list[int], batch_cap: int, knobs: list[str],
                           steps: int) -> float | None:
    """The emulated run's trained samples per second (cluster.compute=emulated, the same
    scenario, split, batch cap and pipeline knobs): to be wired once the runtime runs partial
    rollouts. None: not measured."""
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[16, 8])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-cap", type=int, default=None, help="every instance's live-batch cap (default: the "
                    "allocator's choice from the scenario's caps)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = []
    cap = [f"cluster.batch_cap={args.batch_cap}", "cluster.batch_caps=[]"] if args.batch_cap else []
    print(f"{SCENARIO}, pipeline.mode=async, {args.steps} steps, batch cap {args.batch_cap or 'chosen by the allocator'}")
    print(f"{'devices':>7} {'split':>6} {'cap':>4} {'staleness':>9} {'window':>7} {'extra':>6} {'s/step':>7} "
          f"{'samples/s':>9} {'vs 1':>6} {'lag>=2':>7} {'emulated':>9}")
    for devices in args.devices:
        base = None
        for staleness, window, extra in CONFIGS:
            knobs = overrides(staleness, window, extra)
            sim = Simulation(load_scenario(SCENARIO, QUIET + [f"steps={args.steps}", f"cluster.devices={devices}"]
                                           + cap + knobs))
            s = sim.run()
            base = base or s.samples_per_s
            stale = sum(n for lag, n in s.tokens_by_lag.items() if lag >= 2) / sum(s.tokens_by_lag.values())
            emulated = emulated_samples_per_s(devices, s.initial_split, sim.batch_cap, knobs, args.steps)
            row = {"devices": devices, "split": s.initial_split, "batch_cap": sim.batch_cap,
                   "max_staleness": staleness, "partial_tokens": window, "overprovision": extra,
                   "step_s": s.step_s_mean, "samples_per_s": s.samples_per_s, "vs_staleness_1": s.samples_per_s / base,
                   "stale_token_share": stale, "tokens_by_lag": s.tokens_by_lag, "emulated_samples_per_s": emulated}
            rows.append(row)
            print(f"{devices:>7} {str(sim.records[0].split):>6} {sim.batch_cap:>4} {staleness:>9} {window or '-':>7} {extra:>6} "
                  f"{s.step_s_mean:>7.1f} {s.samples_per_s:>9.2f} {row['vs_staleness_1']:>5.2f}x {stale:>7.0%} "
                  f"{'-' if emulated is None else f'{emulated:.2f}':>9}")
    wall = time.perf_counter() - t0
    print(f"\n({wall:.1f} s wall)")
    write_results("partial_rollouts", {"scenario": SCENARIO, "steps": args.steps, "batch_cap": args.batch_cap,
                                       "rows": rows, "wall_s": wall})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
