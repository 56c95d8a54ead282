"""Elastic scale-out of generation (StreamRL §4.2) on the streamrl-elastic scenario.

    .venv/bin/python benchmarks/sim_elastic.py

Table 1, one run each on the same workload (outputs lengthen at steps 30 and 60):
  fixed 4+4       the 8-device pool for the whole run (scale.policy=static)
  elastic         the same pool; the scale controller lets up to 4 reserve devices join
  fixed 8+4       all 12 devices from step 0 (the reserve held for the whole run)
throughput (output tokens per second of the run) and tokens per device-second (a joined device
counts from its join), as ratios to the fixed 8-device pool.
Table 2: each join: the step after which it was decided, the first step it served, and the
data-phase shift it answered.
Table 3: the threshold's justification: the spread of the lag signal (rollout_s / train_s - 1)
per phase of the fixed pool, and the elastic run for other thresholds and consecutive counts.
Writes bench-results/sim_elastic-<timestamp>.json.
"""

from __future__ import annotations

import statistics
import time

from results import write_results  # benchmarks/results.py
from poise.sim import load_scenario
from poise.sim.driver import Simulation
from poise.sim.workload import ParametricWorkload

SCENARIO = "streamrl-elastic"


def run(overrides: list[str]) -> tuple[Simulation, dict]:
    sim = Simulation(load_scenario(SCENARIO, overrides))
    s = sim.run()
    return sim, s.as_dict()


def phase_starts(sim: Simulation) -> list[int]:
    w = sim.workload
    assert isinstance(w, ParametricWorkload)
    starts, last = [], None
    for k in range(sim.sc.steps):
        phase = w.phase_of(k)[0]
        if phase != last:
            starts.append(k)
            last = phase
    return starts


def main() -> int:
    t0 = time.perf_counter()
    contenders = {
        "fixed 4+4": ["scale.policy=static"],
        "elastic 4+4 (+<=4)": [],
        "fixed 8+4": ["scale.policy=static", "cluster.devices=12", "split=[8,4]"],
    }
    results, sims = {}, {}
    for name, overrides in contenders.items():
        sims[name], results[name] = run(overrides)
    base = results["fixed 4+4"]
    print(f"{SCENARIO}: {base['steps']} steps, async, outputs lengthen at steps "
          f"{phase_starts(sims['fixed 4+4'])[1:]}")
    print(f"{'contender':<20} {'total s':>8} {'tok/s':>8} {'vs fixed':>8} {'tok/dev-s':>9} {'vs fixed':>8} "
          f"{'joins':>5}")
    table = []
    for name, s in results.items():
        row = {"contender": name, "total_s": s["total_s"], "tokens_per_s": s["tokens_per_s"],
               "throughput_vs_fixed": s["tokens_per_s"] / base["tokens_per_s"],
               "tokens_per_device_s": s["tokens_per_device_s"],
               "per_device_vs_fixed": s["tokens_per_device_s"] / base["tokens_per_device_s"],
               "joins": len(s["joins"]), "device_s": s["device_s"]}
        table.append(row)
        print(f"{name:<20} {s['total_s']:>8,.0f} {s['tokens_per_s']:>8,.0f} {row['throughput_vs_fixed']:>8.2f}x "
              f"{s['tokens_per_device_s']:>9,.0f} {row['per_device_vs_fixed']:>8.2f}x {len(s['joins']):>5}")

    shifts = phase_starts(sims["fixed 4+4"])[1:]
    elastic = results["elastic 4+4 (+<=4)"]
    print("\njoins of the elastic run (phase shifts at steps " + ", ".join(map(str, shifts)) + ")")
    print(f"{'decided after step':>18} {'first step served':>17} {'steps after shift':>17} {'instances':>9}  reason")
    joins = []
    for j in elastic["joins"]:
        shift = max([s for s in shifts if s <= j["step"]], default=0)
        joins.append({**j, "phase_shift": shift, "steps_after_shift": j["step"] - shift})
        print(f"{j['step']:>18} {j['first_step']:>17} {j['step'] - shift:>17} {j['instances']:>9}  {j['reason']}")

    fixed = sims["fixed 4+4"]
    print("\nlag signal rollout_s / train_s - 1 of the fixed pool, per phase")
    print(f"{'phase steps':>12} {'mean':>7} {'stdev':>7} {'max':>7} {'steps > 10%':>11}")
    bounds = phase_starts(fixed) + [fixed.sc.steps]
    noise = []
    for lo, hi in zip(bounds, bounds[1:]):
        lags = [r.rollout_s / r.train_s - 1 for r in fixed.records[max(lo, 1):hi]]  # step 0: nothing to overlap
        row = {"steps": [lo, hi - 1], "mean": statistics.fmean(lags), "stdev": statistics.stdev(lags),
               "max": max(lags), "over_10pct": sum(x > 0.10 for x in lags), "n": len(lags)}
        noise.append(row)
        print(f"{f'{lo}-{hi - 1}':>12} {row['mean']:>+7.1%} {row['stdev']:>7.1%} {row['max']:>+7.1%} "
              f"{row['over_10pct']:>6} of {row['n']}")

    print("\nsensitivity of the elastic run (vs the fixed pool)")
    print(f"{'override':<24} {'tok/s vs fixed':>14} {'tok/dev-s vs fixed':>18}  joins decided after step")
    sens = []
    for item in ["(scenario values)", "scale.threshold=0.0", "scale.threshold=0.05", "scale.threshold=0.2",
                 "scale.threshold=0.3", "scale.consecutive=1", "scale.consecutive=5", "scale.cooldown_steps=0"]:
        _, s = run([] if item.startswith("(") else [item])
        row = {"override": item, "throughput_vs_fixed": s["tokens_per_s"] / base["tokens_per_s"],
               "per_device_vs_fixed": s["tokens_per_device_s"] / base["tokens_per_device_s"],
               "joins_after_steps": [j["step"] for j in s["joins"]]}
        sens.append(row)
        print(f"{item:<24} {row['throughput_vs_fixed']:>13.2f}x {row['per_device_vs_fixed']:>17.2f}x  "
              f"{row['joins_after_steps']}")
    wall = time.perf_counter() - t0
    print(f"\n({wall:.1f} s wall)")
    write_results("sim_elastic", {"scenario": SCENARIO, "phase_shifts": shifts, "contenders": table,
                                  "joins": joins, "lag_noise": noise, "sensitivity": sens, "wall_s": wall})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
