"""Emulated compute on the real runtime vs the simulator: StreamRL pipeline modes on 16 devices.

    .venv/bin/python benchmarks/runtime_emulated.py [--steps 6] [--warmup 1] [--time-scale 0.05] [--per-process 0]

For each pipeline (non-streaming sync, streaming sync, one-step async) of the scenario
`streamrl-pipeline` (16 devices, a 7B-like cost model, a long-tail reasoning mix), with the split
and batch cap the simulator's allocator picks for that mode, three numbers of modelled seconds
(emulated wall time divided by --time-scale):

  sim       `poise simulate`: the simulator's prediction for the scenario.
  replay    the runtime's own schedule priced by the same cost model with zero control-plane cost:
            each prompt's G samples on one instance in dispatch order, continuous batching under
            the instance's cap (policy.cost kernel), the step plan's micro-batches on their owner
            train devices (policy.plan), started as soon as ready (streaming) or when the batch
            is in; the update after each device's last micro-batch; then the weight sync. The
            simulator models the same structure (prompt groups, the step plan), so replay and
            sim differ only in how the driver loop overlaps steps.
  measured  the emulated run: real actors, RPCs, dispatch, streaming, ledger and sync, compute
            slept. Control-plane overhead = measured / replay - 1 (what the real control plane
            adds to the same sleeps, in the same structure).

Throughput = output tokens of steps warmup.. / time from the end of step warmup-1 to the end of
the last step. Ratios are taken within one method (stream/sync, async/sync). Writes
bench-results/runtime_emulated-<timestamp>.json; runs under runs/bench-emulated-<mode>/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from results import write_results  # benchmarks/results.py
from poise.config import load_train_config
from poise.policy.cost import instance_finish_times
from poise.policy.dispatch import InstanceInfo
from poise.policy.plan import plan_step
from poise.policy.rankers import Finished, Prompt
from poise.runtime.driver import train_disaggregated
from poise.runtime.emulated import Emulation
from poise.sim import load_scenario
from poise.sim.driver import Simulation
from poise.sim.scenario import pipeline_overrides


def train_config(args, mode: str, sc, split, batch_cap: int):
    """The emulated run of scenario `sc` as simulated: its split, batch cap, micro-batches and dispatch."""
    d = sc.dispatch
    return load_train_config(None, [
        "run.progress=false", f"run.steps={args.warmup + args.steps}", f"run.dir=runs/bench-emulated-{mode}",
        "run.overwrite=true", "run.checkpoint_every=0", f"run.seed={sc.seed}", "cluster.compute=emulated",
        f"cluster.devices={args.devices}", f"cluster.split=[{split.rollout},{split.train}]",
        f"rollout.num_slots={batch_cap}", f"algorithm.micro_batch_size={sc.cluster.micro_batch_size}",
        f"dispatch.policy={d.policy}", f"dispatch.ranker={d.ranker}",
        f"dispatch.long_tail_fraction={d.long_tail_fraction}", f"dispatch.tail_batch_cap={d.tail_batch_cap}",
        f"dispatch.tail_instances={'null' if d.tail_instances is None else d.tail_instances}",
        f"emulation.scenario={args.scenario}", f"emulation.time_scale={args.time_scale}",
        f"emulation.devices_per_process={args.per_process}", *pipeline_overrides(mode)])


def replay(cfg, steps: int) -> list[dict]:
    """Per step (start, end, tokens) of the runtime's structure priced with zero control-plane cost."""
    em = Emulation.from_config(cfg)
    cost, c, algo = em.cost, cfg.cluster, em.cfg.algorithm
    rollout, train = c.split
    streaming, asynchronous = cfg.pipeline.streaming, cfg.pipeline.mode == "async"
    sync_s = cost.sync_s()

    def generate(k: int):
        """Finish time (from generation start) of every sample id of step k, and the step's samples."""
        problems = em.problems(k)
        samples = {s.sample_id: s for s in em.workload.step(k)}
        plan = em.dispatcher.plan([Prompt(p.uid, p.prompt) for p in problems],
                                  [InstanceInfo(i, cfg.rollout.num_slots) for i in range(rollout)])
        queues: dict[int, list] = {i: [] for i in range(rollout)}
        for prompt_index, inst in plan.order:  # the service: a prompt's G samples, in plan order
            queues[inst] += [(k, prompt_index, j) for j in range(algo.group_size)]
        finish = {}
        for inst, ids in queues.items():
            cap = max(1, min(cfg.rollout.num_slots, plan.batch_caps.get(inst, cfg.rollout.num_slots)))
            times = instance_finish_times(cost, [samples[i].output_length for i in ids],
                                          [samples[i].prompt_len for i in ids], cap)
            finish.update(zip(ids, times))
        em.ranker.observe([Finished(Prompt(problems[i[1]].uid), samples[i].output_length) for i in finish])
        return finish, samples

    def train_time(k: int, finish: dict, samples: dict, start_all: float | None) -> float:
        """End of the step's training (from generation start; `start_all`: everything ready then)."""
        mini = plan_step(k, algo.prompts_per_step, algo.group_size, micro_batch_size=algo.micro_batch_size,
                         train_devices=train).minis[0]
        micro = mini.micro
        ready = [start_all if start_all is not None else max(finish[i] for i in m) for m in micro]
        ends = []
        for lo, hi in mini.ranges:
            t = 0.0
            for j in sorted(range(lo, hi), key=lambda j: (ready[j], j)):
                tokens = sum(samples[i].output_length + samples[i].prompt_len for i in micro[j])
                t = max(t, ready[j]) + cost.train_compute_s(tokens, 1)
            ends.append(t + cost.train_fixed_s(train))
        return max(ends)

    out, t = [], 0.0
    ahead = generate(0) if asynchronous else None
    for k in range(steps):
        if asynchronous:  # train step k (all in) while step k+1 generates, then sync
            finish, samples = ahead
            trained = train_time(k, finish, samples, 0.0)
            gen_next = 0.0
            if k + 1 < steps:
                ahead = generate(k + 1)
                gen_next = max(ahead[0].values())
            dur = (max(finish.values()) if k == 0 else 0.0) + max(trained, gen_next) + sync_s
        else:
            finish, samples = generate(k)
            gen_end = max(finish.values())
            dur = max(gen_end, train_time(k, finish, samples, None if streaming else gen_end)) + sync_s
        gen = max(finish.values()) if not asynchronous else (gen_next if k + 1 < steps else 0.0)
        out.append({"start": t, "end": t + dur, "tokens": sum(s.output_length for s in samples.values()),
                    "rollout_s": gen})
        t += dur
    return out


def throughput(steps: list[dict], warmup: int) -> tuple[float, float]:
    """(tokens per modelled second, mean step seconds) over steps warmup.. (back to back)."""
    window = steps[warmup:]
    begin = steps[warmup - 1]["end"] if warmup else steps[0]["start"]
    span = window[-1]["end"] - begin
    return sum(s["tokens"] for s in window) / span, span / len(window)


def measured_steps(run_dir: Path, scale: float) -> list[dict]:
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return [{"start": e["start"] / scale, "end": e["end"] / scale, "tokens": e["tokens"],
             "rollout_s": e["rollout_s"] / scale} for e in events if e["kind"] == "step"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="measured steps per mode (after the warm-up)")
    ap.add_argument("--warmup", type=int, default=1, help="steps left out of every figure")
    ap.add_argument("--time-scale", type=float, default=0.05, help="wall seconds slept per modelled second")
    ap.add_argument("--devices", type=int, default=16)
    ap.add_argument("--scenario", default="streamrl-pipeline")
    ap.add_argument("--per-process", type=int, default=0,
                    help="emulation.devices_per_process (0: auto, one per process up to 16 devices)")
    ap.add_argument("--modes", default="sync,stream,async")
    args = ap.parse_args()
    total = args.warmup + args.steps
    results = {}
    t0 = time.perf_counter()
    for mode in args.modes.split(","):
        sc = load_scenario(args.scenario, [*pipeline_overrides(mode), f"steps={total}",
                                           f"cluster.devices={args.devices}", "log.samples=false",
                                           "log.intervals=none"])
        sim = Simulation(sc)
        sim.run()
        sim_steps = [{"start": r.train_end - r.step_s, "end": r.train_end, "tokens": r.tokens} for r in sim.records]
        cfg = train_config(args, mode, sc, sim.records[0].split, sim.batch_cap)
        rep = replay(cfg, total)
        wall = time.perf_counter()
        train_disaggregated(cfg)
        wall = time.perf_counter() - wall
        meas = measured_steps(Path(cfg.run.dir), args.time_scale)
        row = {"split": list(cfg.cluster.split), "batch_cap": sim.batch_cap, "wall_s": wall}
        for name, steps in (("sim", sim_steps), ("replay", rep), ("measured", meas)):
            tput, step_s = throughput(steps, args.warmup)
            row[name] = {"tokens_per_s": tput, "step_s": step_s, "steps": steps}
        row["overhead"] = row["measured"]["step_s"] / row["replay"]["step_s"] - 1
        # the same overhead in wall seconds per step: a fixed cost of the control plane, not of the scale
        row["overhead_wall_s"] = (row["measured"]["step_s"] - row["replay"]["step_s"]) * args.time_scale
        row["replay_vs_sim"] = row["replay"]["step_s"] / row["sim"]["step_s"] - 1
        # per step (end to end, after the warm-up): one slow step on a shared host moves the mean
        per_step = [((m1["end"] - m0["end"]) - (r1["end"] - r0["end"])) * args.time_scale
                    for m0, m1, r0, r1 in zip(meas[args.warmup - 1:], meas[args.warmup:], rep[args.warmup - 1:],
                                              rep[args.warmup:])] if args.warmup else []
        row["overhead_wall_s_per_step"] = per_step
        results[mode] = row
        print(f"{mode}: {wall:.0f} s wall; step s sim {row['sim']['step_s']:.1f} replay {row['replay']['step_s']:.1f} "
              f"measured {row['measured']['step_s']:.1f} (modelled seconds)", flush=True)

    print(f"\n{args.scenario}, {args.devices} emulated devices, time scale {args.time_scale:g}, "
          f"steps {args.warmup}..{total - 1} (modelled seconds = wall / time scale)")
    print(f"{'mode':<7} {'split':>6} {'cap':>4} {'sim step':>9} {'replay':>7} {'measured':>9} "
          f"{'overhead':>9} {'wall ms':>8} {'median':>7} {'max':>5} {'replay/sim':>10}")
    for mode, r in results.items():
        per = sorted(r["overhead_wall_s_per_step"]) or [float("nan")]
        print(f"{mode:<7} {'%d:%d' % tuple(r['split']):>6} {r['batch_cap']:>4} {r['sim']['step_s']:>9.2f} "
              f"{r['replay']['step_s']:>7.2f} {r['measured']['step_s']:>9.2f} {r['overhead']:>+9.1%} "
              f"{1000 * r['overhead_wall_s']:>8.0f} {1000 * statistics.median(per):>7.0f} {1000 * per[-1]:>5.0f} "
              f"{r['replay_vs_sim']:>+10.1%}")
    print("wall ms: (measured - replay) per step, mean over the window; median, max: of the steps one by one")
    ratios = {}
    if "sync" in results:
        print(f"\n{'throughput ratio':<16} {'sim':>6} {'replay':>7} {'measured':>9} {'measured/sim':>13}")
        for mode in [m for m in results if m != "sync"]:
            r = {name: results[mode][name]["tokens_per_s"] / results["sync"][name]["tokens_per_s"]
                 for name in ("sim", "replay", "measured")}
            r["measured_vs_sim"] = r["measured"] / r["sim"] - 1
            ratios[f"{mode}/sync"] = r
            print(f"{mode + '/sync':<16} {r['sim']:>6.3f} {r['replay']:>7.3f} {r['measured']:>9.3f} "
                  f"{r['measured_vs_sim']:>+13.1%}")
    wall = time.perf_counter() - t0
    print(f"\n({wall:.0f} s wall)")
    write_results("runtime_emulated", {"args": vars(args), "modes": results, "ratios": ratios, "wall_s": wall})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
