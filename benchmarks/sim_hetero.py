"""StreamRL on the simulator: heterogeneous devices (throughput per dollar) and a cross-datacenter link.

    .venv/bin/python benchmarks/sim_hetero.py [--steps N] [--quick]

Table 1 (scenario streamrl-hetero): the device planner's per-type split against the best
single-type split of each type for the same budget, each simulated; throughput per dollar
(generated tokens per USD) and its ratio to the best single-type split (StreamRL §7.3: 1.33x).
Table 2: the same comparison with one input changed at a time (H20 price, the per-sequence
decode matmul cost, output lengths), to show which inputs drive the figure.
Table 3 (scenario streamrl-crossdc): the planner's split at 80 Gbps held fixed while the link
goes from 10 to 400 Gbps: weight-sync seconds, their share of a step, and the exposed overhead
(step time over that of the same run with a free sync, minus one) in async (the scenario) and
sync pipelines; then the bandwidth at which each exposed overhead crosses 2% (bisection).
Writes bench-results/sim_hetero-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import math
import time

from results import write_results  # benchmarks/results.py
from poise.policy.allocator import DeviceSplit
from poise.sim import load_scenario
from poise.sim.driver import Simulation
from poise.sim.scenario import scenario_data

QUIET = ["log.samples=false", "log.intervals=none"]
FREE_SYNC = ["cost.weight_bytes=0", "cost.sync_latency_s=0"]
GBPS = (10, 20, 40, 80, 100, 200, 400)


def pinned(d: DeviceSplit) -> list[str]:
    """Overrides that run exactly the per-type split `d`."""
    return [f"split=[{d.split.rollout},{d.split.train}]", f"cluster.rollout_type={d.rollout_type}",
            f"cluster.train_type={d.train_type}", f"cluster.batch_cap={d.batch_cap}"]


def compare(scenario: str, extra: list[str]) -> dict:
    """Plan, then simulate the planner's split and each type's best single-type split."""
    sim = Simulation(load_scenario(scenario, extra))
    dplan = sim.device_plan
    assert dplan is not None, f"{scenario} has no device types with split: auto"
    rows = []
    for label, d in [("planner", dplan.best)] + [(f"{n} only", d) for n, d in dplan.single_type.items()]:
        s = Simulation(load_scenario(scenario, extra + pinned(d))).run()
        rows.append({"contender": label, "rollout_type": d.rollout_type, "train_type": d.train_type,
                     "split": d.split.as_list(), "batch_cap": d.batch_cap, "price_per_hour": d.price_per_hour,
                     "predicted_step_s": d.predicted.step_s, "predicted_tokens_per_dollar": d.tokens_per_dollar,
                     "step_s": s.step_s_mean, "tokens_per_s": s.tokens_per_s,
                     "tokens_per_dollar": s.tokens_per_s * 3600.0 / d.price_per_hour})
    single = [r for r in rows[1:]]
    best_single = max(single, key=lambda r: r["tokens_per_dollar"])
    return {"rows": rows, "best_single_type": best_single["contender"],
            "ratio": rows[0]["tokens_per_dollar"] / best_single["tokens_per_dollar"],
            "predicted_ratio": rows[0]["predicted_tokens_per_dollar"]
            / max(r["predicted_tokens_per_dollar"] for r in single)}


def type_index(scenario: str, name: str) -> int:
    types = scenario_data(scenario)["cluster"]["device_types"]
    return next(i for i, t in enumerate(types) if t["name"] == name)


def link_run(pin: list[str], gbps: float, mode: str, extra: list[str]) -> tuple[float, float, float]:
    """(sync seconds, mean step seconds with the link, with a free sync) of streamrl-crossdc."""
    over = extra + pin + [f"cluster.links[0].gbps={gbps}", f"pipeline.mode={mode}", "pipeline.streaming=false"]
    sim = Simulation(load_scenario("streamrl-crossdc", over))
    s = sim.run()
    free = Simulation(load_scenario("streamrl-crossdc", over + FREE_SYNC)).run()
    return sim.sync_s, s.step_s_mean, free.step_s_mean


def overhead(pin: list[str], gbps: float, key: str, extra: list[str]) -> float:
    """`key` of a sweep row at `gbps`: exposed_async, exposed_sync or share_async."""
    mode = "sync" if key == "exposed_sync" else "async"
    sync_s, step, free = link_run(pin, gbps, mode, extra)
    return sync_s / step if key == "share_async" else step / free - 1.0


def crossing(pin: list[str], key: str, extra: list[str], table: list[dict], target: float = 0.02) -> float | None:
    """The lowest bandwidth (Gbps) at which `key` is at most `target`, by bisection on log
    bandwidth between the sweep's bracketing points (to ~1%); None if it never is."""
    above = [r["gbps"] for r in table if r[key] > target]
    below = [r["gbps"] for r in table if r[key] <= target and (not above or r["gbps"] > max(above))]
    if not below:
        return None
    if not above:
        return float(min(below))  # at or below target over the whole sweep
    lo, hi = max(above), min(below)
    for _ in range(6):
        mid = math.sqrt(lo * hi)
        if overhead(pin, mid, key, extra) > target:
            lo = mid
        else:
            hi = mid
    return hi


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="skip the sensitivity table")
    args = ap.parse_args()
    extra = QUIET + ([f"steps={args.steps}"] if args.steps else [])
    t0 = time.perf_counter()

    print("streamrl-hetero: per-type split vs the best single-type split of the same budget")
    main_cmp = compare("streamrl-hetero", extra)
    print(f"{'contender':<10} {'split':<32} {'cap':>4} {'$/h':>6} {'step s':>7} {'tok/s':>7} {'tok/$':>10} "
          f"{'pred tok/$':>10}")
    for r in main_cmp["rows"]:
        split = f"{r['split'][0]} {r['rollout_type']} rollout + {r['split'][1]} {r['train_type']} train"
        print(f"{r['contender']:<10} {split:<32} {r['batch_cap']:>4} {r['price_per_hour']:>6.2f} {r['step_s']:>7.1f} "
              f"{r['tokens_per_s']:>7,.0f} {r['tokens_per_dollar']:>10,.0f} {r['predicted_tokens_per_dollar']:>10,.0f}")
    print(f"planner / best single-type ({main_cmp['best_single_type']}): {main_cmp['ratio']:.2f}x throughput per "
          f"dollar simulated, {main_cmp['predicted_ratio']:.2f}x predicted (StreamRL §7.3: 1.33x)")

    sensitivity = []
    if not args.quick:
        h20 = type_index("streamrl-hetero", "h20")
        variants = [("H20 $0.60/h", [f"cluster.device_types[{h20}].price_per_hour=0.6"]),
                    ("H20 $1.40/h", [f"cluster.device_types[{h20}].price_per_hour=1.4"]),
                    ("H20 $1.80/h", [f"cluster.device_types[{h20}].price_per_hour=1.8"]),
                    ("decode matmuls x2", ["cost.decode_per_seq_s=0.00006"]),
                    ("decode matmuls x0.5", ["cost.decode_per_seq_s=0.000015"]),
                    ("outputs x0.5", ["workload.phases[0].mix[0].median=450", "workload.phases[0].mix[1].median=300",
                                      "workload.phases[0].mix[0].max_len=8192",
                                      "workload.phases[0].mix[1].max_len=8192"]),
                    ("outputs x2", ["workload.phases[0].mix[0].median=1800", "workload.phases[0].mix[1].median=1200",
                                    "workload.phases[0].mix[0].max_len=32768",
                                    "workload.phases[0].mix[1].max_len=32768"])]
        print("\nwhich inputs drive it (one change at a time)")
        print(f"{'change':<20} {'planner split':<16} {'$/h':>5} {'best single type':<17} {'$/h':>5} "
              f"{'tok/s ratio':>11} {'tok/$ ratio':>11} {'predicted':>9}")
        for label, over in variants:
            c = compare("streamrl-hetero", extra + over)
            p, b = c["rows"][0], next(r for r in c["rows"] if r["contender"] == c["best_single_type"])
            ps = f"{p['split'][0]} {p['rollout_type']} + {p['split'][1]} {p['train_type']}"
            bs = f"{b['split'][0]} {b['rollout_type']} + {b['split'][1]} {b['train_type']}"
            print(f"{label:<20} {ps:<16} {p['price_per_hour']:>5.1f} {bs:<17} {b['price_per_hour']:>5.1f} "
                  f"{p['tokens_per_s'] / b['tokens_per_s']:>10.2f}x {c['ratio']:>10.2f}x {c['predicted_ratio']:>8.2f}x")
            sensitivity.append({"change": label, "overrides": over, **c})

    print("\nstreamrl-crossdc: weight sync across the link, split fixed at the planner's choice for 80 Gbps")
    plan80 = Simulation(load_scenario("streamrl-crossdc", extra))
    assert plan80.device_plan is not None
    pin = pinned(plan80.device_plan.best)
    print(f"split: {plan80.device_plan.best}, batch cap {plan80.batch_cap}")
    print(f"{'Gbps':>5} {'sync s':>7} {'async step s':>12} {'sync/step':>9} {'exposed async':>13} "
          f"{'sync step s':>11} {'exposed sync':>12}")
    table = []
    for gbps in GBPS:
        sync_s, step_a, free_a = link_run(pin, gbps, "async", extra)
        _, step_s, free_s = link_run(pin, gbps, "sync", extra)
        row = {"gbps": gbps, "sync_s": sync_s, "step_s_async": step_a, "share_async": sync_s / step_a,
               "exposed_async": step_a / free_a - 1.0, "step_s_sync": step_s, "exposed_sync": step_s / free_s - 1.0}
        table.append(row)
        print(f"{gbps:>5} {sync_s:>7.2f} {step_a:>12.1f} {row['share_async']:>9.2%} {row['exposed_async']:>13.2%} "
              f"{step_s:>11.1f} {row['exposed_sync']:>12.2%}")
    what = {"share_async": "weight-sync seconds <= 2% of an async step",
            "exposed_async": "exposed weight-sync overhead <= 2% of a step, async",
            "exposed_sync": "exposed weight-sync overhead <= 2% of a step, sync"}
    cross = {key: crossing(pin, key, extra, table) for key in what}
    for key, g in cross.items():
        where = f"from {g:.0f} Gbps up" if g is not None else "nowhere in 10..400 Gbps"
        print(f"{what[key]}: {where}")
    wall = time.perf_counter() - t0
    print(f"\n({wall:.1f} s wall)")
    write_results("sim_hetero", {"hetero": main_cmp, "sensitivity": sensitivity,
                                 "crossdc": {"split": plan80.device_plan.best.__str__(), "batch_cap": plan80.batch_cap,
                                             "sweep": table, "crossing_2pct_gbps": cross}, "wall_s": wall})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
