"""DynaResize on the simulator: dynamic split with live (and hard) resize vs every static split.

    .venv/bin/python benchmarks/sim_dynaresize.py [--scenario dynaresize-8xh20] [--steps N]

For the scenario, runs every static split of the pool (all splits searched, DynaResize
review objection 2), the paper's baseline split (the scenario's `split`) held static, and the
resize controller with live and with hard resizes. Reports end-to-end throughput (generated
tokens / virtual seconds), the gain of dynamic-live over the best static split and over the
paper's baseline, the steady-state step times before and after the first resize, and the
break-even step count of that resize (predicted by the controller; measured from step times).
Writes bench-results/sim_dynaresize-<scenario>-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

from poise.policy.split import all_splits
from poise.sim import load_scenario
from poise.sim.driver import Simulation

QUIET = ["log.samples=false", "log.intervals=none"]


def run(scenario: str, extra: list[str]) -> Simulation:
    sim = Simulation(load_scenario(scenario, QUIET + extra))
    sim.summary_ = sim.run()  # type: ignore[attr-defined]
    return sim


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="dynaresize-8xh20")
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args()
    extra = [f"steps={args.steps}"] if args.steps else []
    t0 = time.perf_counter()
    base = load_scenario(args.scenario, extra)
    c = base.cluster
    rows = []
    print(f"{args.scenario}: {c.devices} devices, mode {base.kind}, {base.steps} steps")
    print(f"{'run':<22} {'split':>9} {'total s':>9} {'tok/s':>8} {'mean step s':>11} {'resizes':>7}")
    static = {}
    for split in all_splits(c.devices, c.devices_per_instance):
        sim = run(args.scenario, extra + ["resize.policy=static", f"split=[{split.rollout},{split.train}]"])
        s = sim.summary_
        static[str(split)] = s
        rows.append({"run": f"static {split}", **s.as_dict()})
        print(f"{'static':<22} {str(split):>9} {s.total_s:>9,.0f} {s.tokens_per_s:>8,.0f} {s.step_s_mean:>11.1f} {0:>7}")
    best_name = min(static, key=lambda k: static[k].total_s)
    best = static[best_name]
    dyn = {}
    for mode in ("live", "hard"):
        sim = run(args.scenario, extra + ["resize.policy=controller", f"resize.mode={mode}"])
        s = sim.summary_
        dyn[mode] = (sim, s)
        rows.append({"run": f"dynamic {mode}", **s.as_dict()})
        print(f"{'dynamic ' + mode:<22} {str(s.initial_split):>9} {s.total_s:>9,.0f} {s.tokens_per_s:>8,.0f} "
              f"{s.step_s_mean:>11.1f} {len(s.resizes):>7}")
    sim, live = dyn["live"]
    baseline_name = "auto" if base.split == "auto" else f"{base.split[0]}:{base.split[1]}"
    baseline = static.get(baseline_name)
    result = {"scenario": args.scenario, "steps": base.steps, "best_static_split": best_name,
              "gain_live_vs_best_static": live.tokens_per_s / best.tokens_per_s - 1.0,
              "gain_hard_vs_best_static": dyn["hard"][1].tokens_per_s / best.tokens_per_s - 1.0}
    print(f"\nbest static split (all searched): {best_name}")
    print(f"dynamic live vs best static: {result['gain_live_vs_best_static']:+.1%} throughput "
          f"(hard: {result['gain_hard_vs_best_static']:+.1%})")
    if baseline is not None:
        result["baseline_split"] = baseline_name
        result["gain_live_vs_baseline"] = live.tokens_per_s / baseline.tokens_per_s - 1.0
        result["time_reduction_live_vs_baseline"] = 1.0 - live.total_s / baseline.total_s
        print(f"dynamic live vs the paper's static {baseline_name}: {result['gain_live_vs_baseline']:+.1%} "
              f"throughput, {result['time_reduction_live_vs_baseline']:.1%} less total time")
    if live.resizes:
        r = live.resizes[0]
        k = r["decided_after_step"]
        steps = [x.step_s for x in sim.records]
        # Mean step time of the 4 steps up to the decision vs every step after the one that
        # absorbed the resize, until the next resize (the paper's Fig. 4(b) comparison).
        end = live.resizes[1]["decided_after_step"] + 1 if len(live.resizes) > 1 else len(steps)
        before = statistics.fmean(steps[max(0, k - 3): k + 1])
        after = statistics.fmean(steps[k + 2: end])
        result.update({"first_resize": r, "step_s_before": before, "step_s_after": after,
                       "steady_gain": before / after - 1.0,
                       "break_even_predicted": live.break_even_steps,
                       "break_even_measured": live.break_even_steps_measured})
        print(f"first resize after step {k}: {r['from']} -> {r['to']}, critical path {r['critical_path_s']:.1f} s "
              f"(hard {dyn['hard'][1].resizes[0]['critical_path_s']:.1f} s)" if dyn["hard"][1].resizes else "")
        print(f"mean step time around it: {before:.1f} s before -> {after:.1f} s after "
              f"({before / after - 1.0:+.1%} steady-state throughput)")
        print(f"break-even: {live.break_even_steps:.1f} steps predicted, "
              f"{live.break_even_steps_measured:.1f} measured (paper: about 11)")
    wall = time.perf_counter() - t0
    print(f"\n({wall:.1f} s wall)")
    out = Path("bench-results")
    out.mkdir(exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"sim_dynaresize-{args.scenario}-{stamp}.json"
    path.write_text(json.dumps({"result": result, "runs": rows, "wall_s": wall}, indent=1, default=str))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
