"""Partial rollouts and over-provisioning on the simulator and the emulated runtime: which staleness
pays on a long tail.

    .venv/bin/python benchmarks/partial_rollouts.py [--devices 16 8] [--steps 60] [--batch-cap 64]
        [--emulated-devices 8] [--emulated-steps 20] [--warmup 3] [--time-scale 0.1]

Scenario streamrl-pipeline (a 7B-like cost model and a long-tail reasoning mix: 64 prompts x 8
samples a step, lognormal and Pareto lengths up to 16k tokens), pipeline.mode=async, each device
count with the split and batch cap the allocator picks (--batch-cap: that cap for every row).
Rows: staleness 1 (one-step-off async, whole samples), then staleness 2, 3 and 4 with
pipeline.partial_tokens (the window) and pipeline.overprovision (extra prompt groups in flight).
Columns: simulated trained samples per second, the ratio to staleness 1 on the same devices, the
share of trained tokens made 2 or more weights versions before the weights they train against, and
the emulated runtime's samples per second.

The emulated column: on each of --emulated-devices, staleness 1 and the staleness-2 row with the
most simulated samples/s run on the real runtime with emulated compute (cluster.compute=emulated:
actors, RPCs, the partial-rollout pool and its windows are real, compute is slept by the same cost
model, --time-scale wall seconds per modelled second), --emulated-steps steps each, with the row's
split and batch cap. A second table sets each against the simulator's prediction for the very same
job (same steps, split and cap), both in trained samples per modelled second over steps
--warmup.. (from the end of step warmup-1), and gives staleness 2 / staleness 1 for each. Writes
bench-results/partial_rollouts-<timestamp>.json; the emulated runs go under
runs/bench-partial-emulated-*.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from results import write_results  # benchmarks/results.py
from poise.config import load_train_config
from poise.runtime.driver import train_disaggregated
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


def emulated_samples_per_s(devices: int, split: list[int], batch_cap: int, knobs: list[str], args) -> dict:
    """One emulated run (cluster.compute=emulated: the real runtime, compute slept by the scenario's
    cost model) of the scenario with `split`, `batch_cap` and the pipeline `knobs`, and the
    simulator's prediction for the very same job (same steps, split and cap). Both are trained
    samples per modelled second over steps warmup.. (emulated wall seconds / time scale), from the
    end of step warmup-1 to the end of the last step."""
    steps = args.emulated_steps
    partial = any(k.startswith("pipeline.partial_tokens=") for k in knobs)
    sc = load_scenario(SCENARIO, QUIET + [f"steps={steps}", f"cluster.devices={devices}", f"split={split}",
                                          f"cluster.batch_cap={batch_cap}", "cluster.batch_caps=[]"] + knobs)
    sim = Simulation(sc)
    sim.run()
    d = sc.dispatch
    run_dir = Path("runs") / f"bench-partial-emulated-{devices}-{'-'.join(k.split('=')[1] for k in knobs[1:])}"
    cfg = load_train_config(None, [
        "run.progress=false", f"run.steps={steps}", f"run.dir={run_dir}", "run.overwrite=true",
        "run.checkpoint_every=0", f"run.seed={sc.seed}", "cluster.compute=emulated", f"cluster.devices={devices}",
        f"cluster.split=[{split[0]},{split[1]}]", f"rollout.num_slots={batch_cap}",
        f"algorithm.micro_batch_size={sc.cluster.micro_batch_size}", f"dispatch.policy={d.policy}",
        f"dispatch.ranker={d.ranker}", f"emulation.scenario={SCENARIO}", f"emulation.time_scale={args.time_scale}",
        *knobs, *(["algorithm.old_logprobs=recompute", "algorithm.rollout_is=token"] if partial else [])])
    wall = time.perf_counter()
    train_disaggregated(cfg)
    wall = time.perf_counter() - wall
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    ends = [e["end"] / args.time_scale for e in events if e["kind"] == "step"]
    samples = sc.workload.prompts_per_step * sc.workload.samples_per_prompt  # every step trains a full batch
    sim_ends = [r.train_end for r in sim.records]
    w = args.warmup
    rate = lambda e: samples * (len(e) - w) / (e[-1] - e[w - 1])  # noqa: E731
    return {"samples_per_s": rate(ends), "sim_samples_per_s": rate(sim_ends), "step_ends": ends,
            "sim_step_ends": sim_ends, "wall_s": wall}


def simulate(devices: int, config: tuple[int, int, int], args, cap: list[str]) -> dict:
    """One simulated row: the scenario on `devices` with the pipeline knobs of `config`."""
    staleness, window, extra = config
    sim = Simulation(load_scenario(SCENARIO, QUIET + [f"steps={args.steps}", f"cluster.devices={devices}"]
                                   + cap + overrides(*config)))
    s = sim.run()
    stale = sum(n for lag, n in s.tokens_by_lag.items() if lag >= 2) / sum(s.tokens_by_lag.values())
    return {"devices": devices, "split": s.initial_split, "batch_cap": sim.batch_cap, "max_staleness": staleness,
            "partial_tokens": window, "overprovision": extra, "step_s": s.step_s_mean,
            "samples_per_s": s.samples_per_s, "stale_token_share": stale, "tokens_by_lag": s.tokens_by_lag,
            "emulated_samples_per_s": None}


def emulate(devices: int, rows: list[dict], args) -> dict:
    """Staleness 1 and the staleness-2 row with the most simulated samples/s, run on the emulated
    runtime; fills their `emulated_samples_per_s` and returns the comparison."""
    chosen = [rows[0], max((r for r in rows if r["max_staleness"] == 2), key=lambda r: r["samples_per_s"])]
    for row in chosen:
        knobs = overrides(row["max_staleness"], row["partial_tokens"], row["overprovision"])
        row["emulated"] = emulated_samples_per_s(devices, row["split"], row["batch_cap"], knobs, args)
        row["emulated_samples_per_s"] = row["emulated"]["samples_per_s"]
        print(f"  emulated {devices} devices, staleness {row['max_staleness']}: "
              f"{row['emulated']['wall_s']:.0f} s wall", flush=True)
    one, two = (r["emulated"] for r in chosen)
    return {"devices": devices, "window": chosen[1]["partial_tokens"], "extra": chosen[1]["overprovision"],
            "rows": [{"max_staleness": r["max_staleness"], "split": r["split"], "batch_cap": r["batch_cap"],
                      "emulated": r["emulated"]["samples_per_s"], "simulated": r["emulated"]["sim_samples_per_s"],
                      "sim_vs_emulated": r["emulated"]["sim_samples_per_s"] / r["emulated"]["samples_per_s"] - 1}
                     for r in chosen],
            "emulated_ratio": two["samples_per_s"] / one["samples_per_s"],
            "simulated_ratio": two["sim_samples_per_s"] / one["sim_samples_per_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[16, 8])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-cap", type=int, default=None, help="every instance's live-batch cap (default: the "
                    "allocator's choice from the scenario's caps)")
    ap.add_argument("--emulated-devices", type=int, nargs="*", default=[8],
                    help="device counts (of --devices) whose staleness 1 and best staleness 2 also run emulated")
    ap.add_argument("--emulated-steps", type=int, default=20, help="steps of each emulated run")
    ap.add_argument("--warmup", type=int, default=3, help="emulated runs: steps left out of the figures")
    ap.add_argument("--time-scale", type=float, default=0.1, help="emulated runs: wall seconds per modelled second")
    args = ap.parse_args()
    if not 1 <= args.warmup < args.emulated_steps:
        ap.error(f"--warmup {args.warmup}: give 1 .. --emulated-steps - 1 (figures start at the end of step warmup-1)")
    t0 = time.perf_counter()
    rows, compared = [], []
    cap = [f"cluster.batch_cap={args.batch_cap}", "cluster.batch_caps=[]"] if args.batch_cap else []
    for devices in args.devices:
        mine = [simulate(devices, config, args, cap) for config in CONFIGS]
        for row in mine:
            row["vs_staleness_1"] = row["samples_per_s"] / mine[0]["samples_per_s"]
        if devices in args.emulated_devices:
            compared.append(emulate(devices, mine, args))
        rows += mine
    print(f"\n{SCENARIO}, pipeline.mode=async, {args.steps} steps, batch cap {args.batch_cap or 'chosen by the allocator'}")
    print(f"{'devices':>7} {'split':>6} {'cap':>4} {'staleness':>9} {'window':>7} {'extra':>6} {'s/step':>7} "
          f"{'samples/s':>9} {'vs 1':>6} {'lag>=2':>7} {'emulated':>9}")
    for r in rows:
        emulated = r["emulated_samples_per_s"]
        print(f"{r['devices']:>7} {'%d:%d' % tuple(r['split']):>6} {r['batch_cap']:>4} {r['max_staleness']:>9} "
              f"{r['partial_tokens'] or '-':>7} {r['overprovision']:>6} {r['step_s']:>7.1f} {r['samples_per_s']:>9.2f} "
              f"{r['vs_staleness_1']:>5.2f}x {r['stale_token_share']:>7.0%} "
              f"{'-' if emulated is None else f'{emulated:.2f}':>9}")
    for c in compared:
        print(f"\nemulated runtime vs simulator, {c['devices']} devices, {args.emulated_steps} steps "
              f"(figures over steps {args.warmup}..{args.emulated_steps - 1}), time scale {args.time_scale:g}")
        print(f"{'staleness':>9} {'split':>6} {'cap':>4} {'emulated':>9} {'simulated':>9} {'sim/emu':>8}")
        for r in c["rows"]:
            print(f"{r['max_staleness']:>9} {'%d:%d' % tuple(r['split']):>6} {r['batch_cap']:>4} {r['emulated']:>9.2f} "
                  f"{r['simulated']:>9.2f} {r['sim_vs_emulated']:>+8.1%}")
        print(f"staleness 2 (window {c['window']}, {c['extra']} extra groups) / staleness 1: emulated "
              f"{c['emulated_ratio']:.2f}x, simulated {c['simulated_ratio']:.2f}x")
    wall = time.perf_counter() - t0
    print(f"\n({wall:.1f} s wall)")
    write_results("partial_rollouts", {"scenario": SCENARIO, "steps": args.steps, "batch_cap": args.batch_cap,
                                       "emulated_steps": args.emulated_steps, "warmup": args.warmup,
                                       "time_scale": args.time_scale, "rows": rows, "emulated": compared,
                                       "wall_s": wall})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
