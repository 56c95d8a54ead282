"""`poise plan WORKLOAD [key=value ...]`: recommend a static split and say whether live resizing
pays on this workload, and by how much.

WORKLOAD is a scenario (name or YAML): its cluster, cost model and workload are used. The
allocator (StreamRL §4.2) prices every split; then the simulator runs the candidate static
splits and the resize controller (live and hard) over `--steps` steps, so the answer accounts
for long tails, phases and length growth, not just the first step.

With `cluster.device_types` the device planner (`plan_devices`) picks each role's type and
count within the budget; the simulator then runs its per-type split and the best single-type
split of each type, and the report gives step time, $/h and throughput per dollar of each.
"""

from __future__ import annotations

import argparse
import json
from typing import Sequence

from poise.errors import PoiseError
from poise.policy.allocator import allocate
from poise.policy.split import all_splits, parse_splits
from poise.policy.turns import EpisodeWork
from poise.sim import load_scenario, simulate
from poise.sim.driver import Simulation, make_cost


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", help="scenario name or YAML whose workload, cluster and cost to plan for")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. pipeline.mode=async cluster.devices=16")
    parser.add_argument("--steps", type=int, default=None, help="steps to simulate (default: the scenario's, at most 200)")
    parser.add_argument("--max-splits", type=int, default=16, help="simulate at most this many static splits "
                        "(the allocator's best ones)")


def run(args: argparse.Namespace) -> int:
    base = load_scenario(args.workload, args.overrides)
    steps = args.steps or min(base.steps, 200)
    if steps < 1:
        raise PoiseError(f"--steps {steps} must be >= 1")
    common = [f"steps={steps}", "log.samples=false", "log.intervals=none"]
    if base.cluster.device_types:
        return plan_device_types(args, steps, common)
    sc = load_scenario(args.workload, args.overrides + common + ["resize.policy=static"])
    c = sc.cluster
    cost = make_cost(sc)
    sim = Simulation(sc)
    works = [sim.step_workload(sim.workload.step(k)) for k in range(min(4, steps))]  # an agent job: its episodes
    # Every split is a static candidate (resize.allowed_splits only limits the controller).
    alloc = allocate(cost, works, c.devices, sc.kind, c.devices_per_instance, c.batch_caps or (c.batch_cap,),
                     None, sim.micro_batches)
    print(f"plan for {base.name}: {c.devices} devices, mode {sc.kind}, {steps} steps")
    if works[0].episodes:
        print(episode_line(works[0].episodes, sc.workload.episode.slots))  # type: ignore[union-attr]
    print(f"allocator (first steps): split {alloc.split}, batch cap {alloc.batch_cap}, "
          f"predicted {alloc.predicted.step_s:.1f} s/step "
          f"(rollout {alloc.predicted.rollout_s:.1f}, train {alloc.predicted.train_s:.1f})")
    best_by_split = {}
    for split, cap, pred in alloc.table:
        if split not in best_by_split or pred.step_s < best_by_split[split][1].step_s:
            best_by_split[split] = (cap, pred)
    candidates = sorted(best_by_split, key=lambda s: best_by_split[s][1].step_s)[: args.max_splits]
    print(f"\n{'split':>10} {'cap':>4} {'predicted s/step':>17} {'simulated s/step':>17} {'total s':>10}")
    results = {}
    for split in sorted(candidates):
        cap, pred = best_by_split[split]
        s = simulate(load_scenario(args.workload, args.overrides + common + [
            "resize.policy=static", f"split=[{split.rollout},{split.train}]", f"cluster.batch_cap={cap}"]))
        results[split] = s
        print(f"{str(split):>10} {cap:>4} {pred.step_s:>17.1f} {s.step_s_mean:>17.1f} {s.total_s:>10,.0f}")
    best = min(results, key=lambda sp: results[sp].total_s)
    static = results[best]
    print(f"\nrecommended static split: {best} ({static.total_s:,.0f} s for {steps} steps, "
          f"{static.tokens_per_s:,.0f} tok/s)")
    allowed = [s.as_list() for s in (parse_splits(base.resize.allowed_splits)
                                      or all_splits(c.devices, c.devices_per_instance))]
    if best.as_list() not in allowed:
        allowed.append(best.as_list())
    for mode in ("live", "hard"):
        dyn = simulate(load_scenario(args.workload, args.overrides + common + [
            "resize.policy=controller", f"resize.mode={mode}", f"split=[{best.rollout},{best.train}]",
            f"cluster.batch_cap={best_by_split[best][0]}", f"resize.allowed_splits={json.dumps(allowed)}"]))
        gain = static.total_s / dyn.total_s - 1.0
        verdict = "pays" if gain > 0.01 else "does not pay"
        extra = ""
        if dyn.resizes:
            be = dyn.break_even_steps
            extra = f"; {len(dyn.resizes)} resize(s), first {dyn.resizes[0]['from']} -> {dyn.resizes[0]['to']}" + \
                    (f", break-even {be:.1f} steps" if be is not None else "")
        print(f"{mode} resizing {verdict}: {gain:+.1%} throughput vs the recommended static split{extra}")
    return 0


def episode_line(episodes: Sequence[EpisodeWork], slots: str) -> str:
    """What an agent job's first step asks for: turns and environment seconds per episode."""
    turns = sum(len(e.turns) for e in episodes) / len(episodes)
    wait = sum(sum(e.env_s) for e in episodes) / len(episodes)
    return (f"agent episodes: {len(episodes)} a step, {turns:.1f} turns and {wait:.1f} s of environment calls "
            f"each (mean); slots: {slots}")


def plan_device_types(args: argparse.Namespace, steps: int, common: list[str]) -> int:
    """`poise plan` with device types: the per-type split against the single-type ones."""
    sim = Simulation(load_scenario(args.workload, args.overrides + common + ["split=auto"]))
    dplan, fleet = sim.device_plan, sim.sc.fleet()
    assert dplan is not None and fleet is not None
    print(f"plan for {sim.sc.name}: mode {sim.sc.kind}, {steps} steps, budget ${dplan.budget_per_hour:,.2f}/h")
    for t in fleet.types.values():
        print(f"  {t.count:>4} x {t.spec()}")
    for link in fleet.links.values():
        print(f"  link {link.between[0]} <-> {link.between[1]}: {link.gbps:g} Gbps, {link.latency_ms:g} ms")
    contenders = [("planner", dplan.best)] + [(f"{name} only", d) for name, d in dplan.single_type.items()
                                               if d != dplan.best]
    print(f"\n{'':<12} {'split':<32} {'cap':>4} {'$/h':>7} {'pred s/step':>11} {'sim s/step':>10} "
          f"{'sim tok/s':>9} {'sim tok/$':>10}")
    simulated = {}
    for label, d in contenders:
        s = simulate(load_scenario(args.workload, args.overrides + common + [
            f"split=[{d.split.rollout},{d.split.train}]", f"cluster.rollout_type={d.rollout_type}",
            f"cluster.train_type={d.train_type}", f"cluster.batch_cap={d.batch_cap}"]))
        per_dollar = s.tokens_per_s * 3600.0 / d.price_per_hour
        simulated[label] = per_dollar
        print(f"{label:<12} {str(d):<32} {d.batch_cap:>4} {d.price_per_hour:>7.2f} {d.predicted.step_s:>11.1f} "
              f"{s.step_s_mean:>10.1f} {s.tokens_per_s:>9,.0f} {per_dollar:>10,.0f}")
    best = dplan.best
    print(f"\nrecommended: {best}, batch cap {best.batch_cap}, ${best.price_per_hour:,.2f}/h: "
          f"{simulated['planner']:,.0f} generated tokens per dollar (simulated)")
    others = {k: v for k, v in simulated.items() if k != "planner"}
    if others:
        label = max(others, key=others.__getitem__)
        print(f"  {simulated['planner'] / others[label]:.2f}x the throughput per dollar of the best single-type "
              f"split ({label})")
    print("resizing: not planned with device types (a role keeps its type; resize.policy must be static)")
    return 0
