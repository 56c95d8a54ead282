"""`poise simulate SCENARIO|FILE [key=value ...]`: run a scenario on the virtual clock.

Writes RUN_DIR/{config.yaml,events.jsonl,metrics.jsonl,summary.json} (docs/events.md) and
prints the summary. `--list` shows the built-in scenarios.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from poise.sim import builtin_scenarios, load_scenario, simulate


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", nargs="?", help="built-in scenario name or a YAML file")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. resize.policy=static split=[5,3]")
    parser.add_argument("--out", default=None, help="run directory (default: runs/sim-<scenario>)")
    parser.add_argument("--list", action="store_true", help="list the built-in scenarios and exit")
    parser.add_argument("--report", action="store_true", help="also draw the report (poise report)")


def run(args: argparse.Namespace) -> int:
    if args.list or not args.scenario:
        for name in builtin_scenarios():
            sc = load_scenario(name)
            print(f"{name:28s} {sc.description}")
        return 0
    sc = load_scenario(args.scenario, args.overrides)
    out = Path(args.out or f"runs/sim-{sc.name}")
    t0 = time.perf_counter()
    s = simulate(sc, out)
    wall = time.perf_counter() - t0
    print(f"scenario {sc.name}: {s.steps} steps, mode {s.mode}, split {s.initial_split} -> {s.final_split}")
    print(f"  virtual time {s.total_s:,.0f} s   throughput {s.tokens_per_s:,.0f} tok/s   "
          f"step {s.step_s_mean:.1f} s mean / {s.step_s_median:.1f} s median")
    print(f"  rollout {s.rollout_s_mean:.1f} s/step   train {s.train_s_mean:.1f} s/step   idle "
          + ", ".join(f"{k} {v:.0%}" for k, v in s.idle_fraction.items()))
    if sc.pipeline.partial:  # partial rollouts: what a trained sample costs in staleness
        total = sum(s.tokens_by_lag.values())
        print(f"  {s.samples_per_s:.2f} trained samples/s; trained tokens by staleness (weights versions): "
              + ", ".join(f"{lag} {n / total:.0%}" for lag, n in s.tokens_by_lag.items()))
    for r in s.resizes:
        print(f"  resize at step {r['step']}: {r['from']} -> {r['to']} ({r['mode']}, "
              f"{r['critical_path_s']:.0f} s): {r['reason']}")
    for j in s.joins:
        print(f"  join after step {j['step']}: device(s) {j['devices']} -> {j['instances']} rollout instances, "
              f"serving from step {j['first_step']}: {j['reason']}")
    if s.joins:
        print(f"  {s.tokens_per_device_s:,.0f} tok per device-second (a joined device counts from its join)")
    if s.break_even_steps is not None:
        measured = s.break_even_steps_measured
        print(f"  break-even of the first resize: {s.break_even_steps:.1f} steps predicted, "
              + (f"{measured:.1f} measured" if measured is not None else "not measurable"))
    print(f"  wrote {out}/ in {wall:.1f} s wall")
    if args.report:
        from poise.report import draw_report

        paths = draw_report(out)
        print(f"  report: {paths['html']}")
    return 0
