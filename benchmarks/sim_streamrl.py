"""StreamRL on the simulator: pipeline modes (§4.1) and skewness-aware dispatch (§5).

    .venv/bin/python benchmarks/sim_streamrl.py [--steps N]

Table 1 (scenario streamrl-pipeline): non-streaming sync, streaming sync (dynamic-batch
pipelining) and one-step async on the same 16-device pool, each with the split the allocator
picks for it; throughput relative to non-streaming sync.
Table 2 (scenario streamrl-skew): mean generation time per step under random, round-robin and
least-loaded dispatch and skew-aware dispatch with each ranker; cut vs random dispatch.
Writes bench-results/sim_streamrl-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import time

from results import write_results  # benchmarks/results.py
from poise.sim import load_scenario
from poise.sim.driver import Simulation
from poise.sim.scenario import pipeline_overrides

QUIET = ["log.samples=false", "log.intervals=none"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args()
    extra = QUIET + ([f"steps={args.steps}"] if args.steps else [])
    t0 = time.perf_counter()
    pipeline = []
    print("streamrl-pipeline")
    print(f"{'mode':<8} {'split':>6} {'cap':>4} {'step s':>7} {'rollout s':>9} {'train s':>8} {'tok/s':>7} {'vs sync':>8}")
    base = None
    for mode in ("sync", "stream", "async"):
        sim = Simulation(load_scenario("streamrl-pipeline", extra + pipeline_overrides(mode)))
        s = sim.run()
        base = base or s.tokens_per_s
        row = {"mode": mode, "split": s.initial_split, "batch_cap": sim.batch_cap, "step_s": s.step_s_mean,
               "rollout_s": s.rollout_s_mean, "train_s": s.train_s_mean, "tokens_per_s": s.tokens_per_s,
               "speedup_vs_sync": s.tokens_per_s / base, "idle_fraction": s.idle_fraction}
        pipeline.append(row)
        print(f"{mode:<8} {str(sim.records[0].split):>6} {sim.batch_cap:>4} {s.step_s_mean:>7.1f} "
              f"{s.rollout_s_mean:>9.1f} {s.train_s_mean:>8.1f} {s.tokens_per_s:>7,.0f} {row['speedup_vs_sync']:>7.2f}x")
    print("\nstreamrl-skew")
    print(f"{'dispatch':<13} {'ranker':<8} {'generation s':>12} {'vs random':>9}")
    skew = []
    base_gen = None
    for policy, ranker in (("random", "random"), ("round_robin", "random"), ("least_loaded", "oracle"),
                           ("skew_aware", "random"), ("skew_aware", "history"), ("skew_aware", "learned"),
                           ("skew_aware", "oracle")):
        s = Simulation(load_scenario("streamrl-skew", extra + [f"dispatch.policy={policy}",
                                                                f"dispatch.ranker={ranker}"])).run()
        base_gen = base_gen or s.rollout_s_mean
        cut = 1.0 - s.rollout_s_mean / base_gen
        skew.append({"dispatch": policy, "ranker": ranker, "generation_s": s.rollout_s_mean, "cut_vs_random": cut})
        print(f"{policy:<13} {ranker:<8} {s.rollout_s_mean:>12.1f} {cut:>+9.1%}")
    wall = time.perf_counter() - t0
    print(f"\n({wall:.1f} s wall)")
    write_results("sim_streamrl", {"pipeline": pipeline, "skew": skew, "wall_s": wall})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
