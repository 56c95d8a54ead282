"""`poise plan WORKLOAD [key=value ...]`: recommend a static split and say whether live resizing
pays on this workload, and by how much.

WORKLOAD is a scenario (name or YAML): its cluster, cost model and workload are used. The
allocator (StreamRL §4.2) prices every split; then the simulator runs the candidate static
splits and the resize controller (live and hard) over `--steps` steps, so the answer accounts
for long tails, phases and length growth, not just the first step.

With `--staleness 0,1,2,4` it compares how stale a trained token may be instead: 0 the sync
loop, 1 one-step-off async, >= 2 async with partial rollouts (pipeline.partial_tokens) and
over-provisioning (pipeline.overprovision), each simulated with the windows and extra groups
given (or a few drawn from the workload's lengths), in one table of samples/s and stale tokens.

With `cluster.device_types` the device planner (`plan_devices`) picks each role's type and
count within the budget; the simulator then runs its per-type split and the best single-type
split of each type, and the report gives step time, $/h and throughput per dollar of each.
"""

from __future__ import annotations

import argparse
import json
from typing import Sequence

from poise.errors import ConfigError, PoiseError
from poise.policy.allocator import allocate
from poise.policy.cost import percentile
from poise.policy.split import all_splits, parse_splits
from poise.policy.turns import EpisodeWork
from poise.sim import Summary, load_scenario, simulate
from poise.sim.driver import Simulation, make_cost


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", help="scenario name or YAML whose workload, cluster and cost to plan for")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. pipeline.mode=async cluster.devices=16")
    parser.add_argument("--steps", type=int, default=None, help="steps to simulate (default: the scenario's, at most 200)")
    parser.add_argument("--max-splits", type=int, default=16, help="simulate at most this many static splits "
                        "(the allocator's best ones)")
    parser.add_argument("--staleness", default=None, metavar="LIST", help="compare max staleness values instead of "
                        "splits, e.g. 0,1,2,4: 0 the sync loop, 1 one-step-off async, >= 2 async with partial rollouts")
    parser.add_argument("--partial-tokens", default=None, metavar="LIST", help="windows (pipeline.partial_tokens) to "
                        "try at staleness >= 2, e.g. 2048,4096 (default: the 75th and 95th percentile output length)")
    parser.add_argument("--overprovision", default=None, metavar="LIST", help="extra prompt groups "
                        "(pipeline.overprovision) to try at staleness >= 2 (default: a quarter and a half of "
                        "workload.prompts_per_step)")


def run(args: argparse.Namespace) -> int:
    stalenesses = int_list("--staleness", args.staleness, 0)
    windows = int_list("--partial-tokens", args.partial_tokens, 1)
    extras = int_list("--overprovision", args.overprovision, 0)
    if (windows or extras) and not stalenesses:
        raise ConfigError("--partial-tokens/--overprovision", args.partial_tokens or args.overprovision,
                          "apply to --staleness: give the staleness values to compare, e.g. --staleness 1,2")
    base = load_scenario(args.workload, args.overrides)
    steps = args.steps or min(base.steps, 200)
    if steps < 1:
        raise PoiseError(f"--steps {steps} must be >= 1")
    common = [f"steps={steps}", "log.samples=false", "log.intervals=none"]
    if stalenesses:
        return plan_staleness(args, steps, common, stalenesses, windows, extras)
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


def int_list(flag: str, text: str | None, low: int) -> list[int]:
    """A comma-separated list of integers >= `low` (empty when the flag is not given)."""
    if text is None:
        return []
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < low:
        raise ConfigError(flag, text, f"give comma-separated integers >= {low}, e.g. {low},{low + 1},{low + 2}")
    return sorted(set(values))


def staleness_knobs(s: int, window: int = 0, extra: int = 0) -> list[str]:
    """The pipeline overrides of max staleness `s` (0: the sync loop; 1: one-step-off async)."""
    return ["pipeline.mode=async", f"pipeline.max_staleness={s}", f"pipeline.partial_tokens={window if s >= 2 else 0}",
            f"pipeline.overprovision={extra if s >= 2 else 0}"]


def plan_staleness(args: argparse.Namespace, steps: int, common: list[str], stalenesses: list[int],
                   windows: list[int], extras: list[int]) -> int:
    """`poise plan --staleness`: every staleness (with each window and extra-group count at >= 2)
    simulated on the scenario's split, the best of each in one table, and which pays."""
    base = load_scenario(args.workload, args.overrides + common)
    prompts = base.workload.prompts_per_step
    if not windows:  # the long tail's scale: windows that cap the longest quarter and twentieth
        lengths = [s.output_length for k in range(min(4, steps)) for s in Simulation(base).workload.step(k)]
        windows = sorted({256 * -(-int(percentile(lengths, q)) // 256) for q in (0.75, 0.95)})
    extras = extras or sorted({max(1, prompts // 4), max(1, prompts // 2)})
    grid = {s: [(w, e) for w in windows for e in extras] if s >= 2 else [(0, 0)] for s in stalenesses}
    # every scenario first: a bad value is one line before any simulation
    scenarios = {(s, w, e): load_scenario(args.workload, args.overrides + common + staleness_knobs(s, w, e))
                 for s, cells in grid.items() for w, e in cells}
    print(f"plan for {base.name}: staleness {', '.join(map(str, stalenesses))}, {steps} steps, "
          f"{base.cluster.devices} devices, {prompts} prompts a step (+ extra groups in flight)")
    print(f"\n{'staleness':>9} {'window':>7} {'extra':>6} {'split':>6} {'s/step':>7} {'samples/s':>9} "
          f"{'vs 1':>6} {'lag>=2':>7} {'mean lag':>8}")
    best: dict[int, tuple[int, int, Summary]] = {}
    for (s, w, e), sc in scenarios.items():
        summary = simulate(sc)
        if s not in best or summary.samples_per_s > best[s][2].samples_per_s:
            best[s] = (w, e, summary)
    ref = best[1][2] if 1 in best else best[stalenesses[0]][2]
    for s in stalenesses:
        w, e, r = best[s]
        lags = r.tokens_by_lag
        total = sum(lags.values())
        stale = sum(n for lag, n in lags.items() if lag >= 2) / total
        mean = sum(lag * n for lag, n in lags.items()) / total
        split = ":".join(map(str, r.initial_split))
        print(f"{s:>9} {w or '-':>7} {e:>6} {split:>6} "
              f"{r.step_s_mean:>7.1f} {r.samples_per_s:>9.2f} {r.samples_per_s / ref.samples_per_s:>5.2f}x "
              f"{stale:>7.0%} {mean:>8.2f}")
    print()
    for s in stalenesses:
        w, e, r = best[s]
        if s == 1 or r is ref:
            continue
        gain = r.samples_per_s / ref.samples_per_s - 1.0
        how = f" (window {w} tokens, {e} extra groups)" if s >= 2 else ""
        print(f"staleness {s} {'pays' if gain > 0.01 else 'does not pay'}: {gain:+.1%} samples/s vs "
              f"{'staleness 1' if 1 in best else f'staleness {stalenesses[0]}'}{how}")
    top = max(stalenesses, key=lambda s: best[s][2].samples_per_s)
    print(f"most samples/s: staleness {top}; lag>=2 is the share of trained tokens made 2 or more weights "
          "versions before the weights they train against")
    return 0
