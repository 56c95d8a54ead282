"""Resize-controller hysteresis: thrashing on alternating short phases, and sensitivity.

    .venv/bin/python benchmarks/sim_controller.py [--steps 80]

Table 1: the dynaresize-8xh20 costs and task phases, but the two phases alternate every
`phase` steps (2 to 12). For each phase length: the initial split held static, a controller
without hysteresis (threshold 5%, 1 signal, no dwell, no cooldown, no break-even check) and
the default controller; total time and resizes.
Table 2: sensitivity of the dynaresize-8xh20 result to each hysteresis parameter, one at a
time around the scenario's values (the analysis DynaResize's reviewers asked for).
Writes bench-results/sim_controller-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import time

from results import write_results  # benchmarks/results.py
from poise.schema import apply_overrides, build
from poise.sim import ScenarioConfig, load_scenario, simulate
from poise.sim.scenario import scenario_data

QUIET = ["log.samples=false", "log.intervals=none"]
NO_HYSTERESIS = ["controller.threshold=0.05", "controller.consecutive=1", "controller.dwell_s=0",
                 "controller.cooldown_steps=0", "controller.break_even=false", "controller.window=1"]


def alternating(phase: int, steps: int, extra: list[str]) -> ScenarioConfig:
    data = scenario_data("dynaresize-8xh20")
    for p in data["workload"]["phases"]:
        p["steps"] = phase
    apply_overrides(data, QUIET + [f"steps={steps}", "workload.cycle_phases=true"] + extra)
    return build(ScenarioConfig, data)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=80)
    args = ap.parse_args()
    t0 = time.perf_counter()
    thrash = []
    print(f"alternating phases, {args.steps} steps (dynaresize-8xh20 costs)")
    print(f"{'phase':>5} {'static s':>9} {'no-hyst s':>9} {'resizes':>7} {'vs static':>9} "
          f"{'default s':>9} {'resizes':>7} {'vs static':>9}")
    for phase in (2, 3, 4, 6, 8, 12):
        st = simulate(alternating(phase, args.steps, ["resize.policy=static"]))
        nh = simulate(alternating(phase, args.steps, NO_HYSTERESIS))
        df = simulate(alternating(phase, args.steps, []))
        row = {"phase": phase, "static_s": st.total_s, "no_hysteresis_s": nh.total_s,
               "no_hysteresis_resizes": len(nh.resizes), "default_s": df.total_s,
               "default_resizes": len(df.resizes)}
        thrash.append(row)
        print(f"{phase:>5} {st.total_s:>9,.0f} {nh.total_s:>9,.0f} {len(nh.resizes):>7} "
              f"{st.total_s / nh.total_s - 1:>+9.1%} {df.total_s:>9,.0f} {len(df.resizes):>7} "
              f"{st.total_s / df.total_s - 1:>+9.1%}")
    print("\nsensitivity on dynaresize-8xh20 (vs its static 6:2)")
    static = simulate(load_scenario("dynaresize-8xh20", QUIET + ["resize.policy=static"]))
    sens = []
    print(f"{'parameter':<36} {'total s':>8} {'vs static':>9} {'resizes':>7}")
    for item in ["(scenario values)", "controller.threshold=0.05", "controller.threshold=0.3",
                 "controller.consecutive=1", "controller.consecutive=6", "controller.cooldown_steps=0",
                 "controller.cooldown_steps=30", "controller.dwell_s=300", "controller.window=1",
                 "controller.window=8", "controller.persistence_prior_steps=5",
                 "controller.persistence_prior_steps=80", "controller.regime_margin=0.05",
                 "controller.regime_margin=0.3", "controller.break_even=false"]:
        extra = [] if item.startswith("(") else [item]
        s = simulate(load_scenario("dynaresize-8xh20", QUIET + extra))
        sens.append({"override": item, "total_s": s.total_s, "gain_vs_static": static.total_s / s.total_s - 1,
                     "resizes": len(s.resizes)})
        print(f"{item:<36} {s.total_s:>8,.0f} {static.total_s / s.total_s - 1:>+9.1%} {len(s.resizes):>7}")
    wall = time.perf_counter() - t0
    print(f"\n({wall:.1f} s wall)")
    write_results("sim_controller", {"alternating": thrash, "sensitivity": sens, "wall_s": wall})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
