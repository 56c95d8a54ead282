"""Live resizing on the runtime: what a resize costs, and what the controller gains.

    .venv/bin/python benchmarks/runtime_resize.py [--real-steps 8] [--emulated-steps 60] [--time-scale 0.02]

real      real compute on 4 CPU devices (a random tiny Qwen2, sync, 4 prompts x 4 samples, 12 new
          tokens): the schedule 2+2 -> 1+3 -> 3+1 -> 2+2 -> 1+3 ... (a resize every step from step
          2 on), once live and once hard (`resize.mode=hard`: checkpoint, kill, restart, reload),
          and, from the `resize` events, the critical-path seconds of each resize with its phases,
          by mode and direction (median), and live / hard. Step time of the static 2+2 run too.
emulated  `configs/emulated-dynaresize.yaml` (8 emulated devices, DynaResize's workload: the task
          mix shifts at step 20) with the resize controller and with the static 6:2 split, next
          to `poise simulate dynaresize-8xh20` with the controller and static: tokens per
          modelled second after the shift, the gain of resizing over static, when the controller
          resized and the break-even it predicted.

Writes bench-results/runtime_resize-<timestamp>.json; runs under runs/bench-resize-*.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from results import write_results  # benchmarks/results.py
from poise.config import load_train_config
from poise.runtime.driver import train_disaggregated
from poise.sim import load_scenario
from poise.sim.driver import Simulation, measured_break_even

TINY = ["run.progress=false", "run.checkpoint_every=0", "run.overwrite=true", "algorithm.prompts_per_step=4",
        "algorithm.group_size=4", "algorithm.micro_batch_size=3", "algorithm.sampling.max_new_tokens=12",
        "rollout.num_slots=8", "cluster.devices=4", "cluster.split=[2,2]", "pipeline.mode=sync",
        "resize.staging_mb=0.25"]  # the optimizer state (2.4 MB) streams in 10 chunks
CYCLE = ([1, 3], [3, 1], [2, 2])


def events(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def real(args) -> dict:
    schedule = ", ".join(f"{{at_step: {k}, split: {CYCLE[(k - 2) % 3]}}}" for k in range(2, args.real_steps))
    out = {}
    for name, extra in (("static", []), ("resized", [f"resize.schedule=[{schedule}]"]),
                        ("hard", [f"resize.schedule=[{schedule}]", "resize.mode=hard"])):
        run_dir = Path(f"runs/bench-resize-real-{name}")
        t = time.perf_counter()
        train_disaggregated(load_train_config(None, [*TINY, f"run.dir={run_dir}", f"run.steps={args.real_steps}",
                                                     *extra]))
        ev = events(run_dir)
        steps = [e["end"] - e["start"] for e in ev if e["kind"] == "step"][1:]
        out[name] = {"wall_s": time.perf_counter() - t, "step_s_median": statistics.median(steps),
                     "resizes": [e for e in ev if e["kind"] == "resize"]}
    by_dir: dict[str, list[dict]] = {}
    for e in out["resized"]["resizes"] + out["hard"]["resizes"]:
        key = f"{e['mode']} " + ("rollout->train" if e["to_train"] else "train->rollout")
        by_dir.setdefault(key, []).append(e)
    out["by_direction"] = {k: {"n": len(v), "critical_path_s_median": statistics.median(e["critical_path_s"] for e in v),
                               "phases_median": {p: statistics.median(e["phases"][p] for e in v) for p in v[0]["phases"]},
                               "moved_samples_median": statistics.median(e["moved_samples"] for e in v),
                               "optimizer_bytes": v[0]["optimizer_bytes"],
                               "peak_host_buffer_bytes": v[0]["peak_host_buffer_bytes"],
                               "groups_created": sum(e["groups_created"] for e in v)} for k, v in by_dir.items()}
    live = statistics.median(e["critical_path_s"] for e in out["resized"]["resizes"])
    hard = statistics.median(e["critical_path_s"] for e in out["hard"]["resizes"])
    out["live_vs_hard"] = {"live_median_s": live, "hard_median_s": hard, "ratio": live / hard}
    return out


def tokens_per_s(steps: list[tuple[float, float, int]], after: int) -> float:
    """Tokens per second over steps `after`.. (back to back): (start, end, tokens) each."""
    window = [s for k, s in enumerate(steps) if k >= after]
    return sum(t for _, _, t in window) / (window[-1][1] - window[0][0])


def emulated(args) -> dict:
    out = {}
    for policy, mode in (("controller", "live"), ("static", "live"), ("controller", "hard")):
        name = policy if mode == "live" else f"{policy}_hard"
        run_dir = Path(f"runs/bench-resize-emulated-{name}")
        cfg = load_train_config("configs/emulated-dynaresize.yaml", [
            f"run.dir={run_dir}", "run.progress=false", f"run.steps={args.emulated_steps}",
            f"emulation.time_scale={args.time_scale}", f"resize.policy={policy}", f"resize.mode={mode}"])
        t = time.perf_counter()
        train_disaggregated(cfg)
        ev = events(run_dir)
        steps = [(e["start"] / args.time_scale, e["end"] / args.time_scale, e["tokens"]) for e in ev if e["kind"] == "step"]
        out[f"emulated_{name}"] = {
            "wall_s": time.perf_counter() - t, "tokens_per_s_after_shift": tokens_per_s(steps, args.shift),
            "resizes": [{**{k: e[k] for k in ("step", "from_split", "to_split", "critical_path_s", "phases")},
                         "critical_path_model_s": e["critical_path_s"] / args.time_scale}
                        for e in ev if e["kind"] == "resize"],
            "decisions": [{k: e[k] for k in ("step", "reason", "break_even_steps")}
                          for e in ev if e["kind"] == "decision" and e["action"] == "resize"]}
        first = out[f"emulated_{name}"]["resizes"][:1]
        if first:  # measured as the simulator measures it: cost / (median step before - after)
            out[f"emulated_{name}"]["break_even_steps_measured"] = measured_break_even(
                [(end - start) for start, end, _ in steps], first[0]["step"], first[0]["critical_path_model_s"])
        if mode == "hard":
            continue
        sc = load_scenario("dynaresize-8xh20", [f"steps={args.emulated_steps}", f"resize.policy={policy}",
                                                "log.samples=false", "log.intervals=none"])
        sim = Simulation(sc)
        summary = sim.run()
        sim_steps = [(r.train_end - r.step_s, r.train_end, r.tokens) for r in sim.records]
        out[f"sim_{policy}"] = {"tokens_per_s_after_shift": tokens_per_s(sim_steps, args.shift),
                                "resizes": sim.resizes,
                                "break_even_steps_measured": summary.break_even_steps_measured}
    for name in ("emulated", "sim"):
        out[f"{name}_gain"] = out[f"{name}_controller"]["tokens_per_s_after_shift"] / \
            out[f"{name}_static"]["tokens_per_s_after_shift"] - 1
    live, hard = out["emulated_controller"]["resizes"], out["emulated_controller_hard"]["resizes"]
    if live and hard:
        out["emulated_live_vs_hard"] = statistics.median(r["critical_path_s"] for r in live) / \
            statistics.median(r["critical_path_s"] for r in hard)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real-steps", type=int, default=8, help="steps of the real-compute runs (resizes from step 2)")
    ap.add_argument("--emulated-steps", type=int, default=60)
    ap.add_argument("--time-scale", type=float, default=0.02, help="emulated: wall seconds per modelled second")
    ap.add_argument("--shift", type=int, default=20, help="the scenario's task-mix shift (step)")
    ap.add_argument("--parts", default="real,emulated")
    args = ap.parse_args()
    results: dict = {"args": vars(args)}
    if "real" in args.parts:
        r = results["real"] = real(args)
        print(f"real compute, 4 CPU devices, sync: static 2+2 step {r['static']['step_s_median']:.3f} s median; "
              f"resized run step {r['resized']['step_s_median']:.3f} s median")
        lh = r["live_vs_hard"]
        print(f"critical path, median over every resize: live {lh['live_median_s']:.3f} s, hard "
              f"{lh['hard_median_s']:.2f} s: live / hard = {lh['ratio']:.4f}")
        print(f"{'direction':<21} {'n':>3} {'critical path s':>16} {'moved':>6} {'opt bytes':>10} {'buffer':>8}  phases (median s)")
        for k, v in r["by_direction"].items():
            phases = " ".join(f"{p}={s:.4f}" for p, s in v["phases_median"].items())
            print(f"{k:<21} {v['n']:>3} {v['critical_path_s_median']:>16.4f} {v['moved_samples_median']:>6.0f} "
                  f"{v['optimizer_bytes']:>10,} {v['peak_host_buffer_bytes']:>8,}  {phases}")
    if "emulated" in args.parts:
        e = results["emulated"] = emulated(args)
        print(f"\ndynaresize-8xh20, 8 devices, {args.emulated_steps} steps, tokens per modelled s from step {args.shift}")
        print(f"{'':<10} {'controller':>11} {'static 6:2':>11} {'gain':>7}  resizes")
        for name in ("emulated", "sim"):
            c, s = e[f"{name}_controller"], e[f"{name}_static"]
            rs = "; ".join(f"step {x['step']} {x.get('from_split', x.get('from'))}->{x.get('to_split', x.get('to'))}"
                           for x in c["resizes"])
            print(f"{name:<10} {c['tokens_per_s_after_shift']:>11.1f} {s['tokens_per_s_after_shift']:>11.1f} "
                  f"{e[f'{name}_gain']:>+7.1%}  {rs}")
        print(f"emulated gain vs simulated gain: {(1 + e['emulated_gain']) / (1 + e['sim_gain']) - 1:+.1%}")
        for name in ("controller", "controller_hard"):
            for r in e[f"emulated_{name}"]["resizes"]:
                print(f"  {name}: resize after step {r['step']} {r['from_split']}->{r['to_split']}, critical path "
                      f"{r['critical_path_s']:.2f} s wall = {r['critical_path_model_s']:.1f} modelled s")
        if "emulated_live_vs_hard" in e:
            print(f"  live / hard critical path: {e['emulated_live_vs_hard']:.3f}")
        for d in e["emulated_controller"]["decisions"]:
            print(f"  controller at step {d['step']}: {d['reason']}")
        for name in ("emulated_controller", "emulated_controller_hard", "sim_controller"):
            r = e[name]
            predicted = r["decisions"][0]["break_even_steps"] if r.get("decisions") else \
                (r["resizes"][0].get("break_even_steps") if r["resizes"] else None)
            measured = r.get("break_even_steps_measured")
            fmt = lambda v: "n/a" if v is None else f"{v:.2f}"
            print(f"  break-even {name}: predicted {fmt(predicted)} steps, measured {fmt(measured)} steps")
    write_results("runtime_resize", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
