"""Memory of an emulated job's worker actors: what 16-64 emulated devices cost a small machine.

    .venv/bin/python benchmarks/emulated_memory.py [--devices 64] [--per-process 0] [--steps 3] [--time-scale 0.01]

Runs `poise train` (a child process: the Ray driver) with `cluster.compute=emulated`,
`pipeline.mode=sync` and a small scenario workload (`workload.prompts_per_step` = devices,
`--group` samples each), and every `--interval` seconds reads the memory of each of the job's
processes from /proc (smaps_rollup; the figures psutil's memory_full_info reports):

  RSS  resident pages, shared library pages counted in every process that maps them;
  PSS  proportional set size: each shared page split among the processes that map it, so the
       sum over processes is what they occupy together;
  USS  pages of that process alone (what killing it frees).

The actors are the processes titled `ray::DeviceWorker...` (a device each) or `ray::DeviceHost...`
(several emulated devices each: `emulation.devices_per_process`, `--per-process`); the table gives the peak over the
samples of the actors' summed RSS / PSS / USS, per-actor means at the PSS peak, the Ray system
processes (raylet, GCS, idle workers...) and the driver, and how many actors map libtorch
(/proc/PID/maps). `--pythonpath DIR` runs another checkout's code for a before/after figure, e.g.
`git archive HEAD~1 | tar -x -C /tmp/before` then `--pythonpath /tmp/before/src`. `--bare-ray`
measures the floor instead of the job: as many Ray actors (same title) that import nothing.
Writes bench-results/emulated_memory-<timestamp>.json; the run goes to runs/bench-emulated-memory/.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from results import write_results  # benchmarks/results.py

from poise.config import EmulationConfig

ACTOR = ("ray::DeviceWorker", "ray::DeviceHost")  # a device's own process, or one of several devices
MB = 2**20
BARE_RAY = """
import sys, time, ray
n = int(sys.argv[1])
ray.init(num_cpus=n, include_dashboard=False, configure_logging=False)
@ray.remote(num_cpus=1)
class DeviceWorker:  # the job's actor title, with nothing of poise imported
    def ready(self):
        return True
actors = [DeviceWorker.remote() for _ in range(n)]
ray.get([a.ready.remote() for a in actors])
time.sleep(5)
"""


def children_map() -> dict[int, list[int]]:
    """ppid -> child pids, from /proc/*/stat (the parent pid is the field after the `(name)`)."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry))
    return out


def descendants(root: int) -> list[int]:
    tree, out, todo = children_map(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += tree.get(pid, [])
    return out


def title(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()


def memory(pid: int) -> dict[str, int]:
    """Rss, Pss and Uss in bytes (/proc/PID/smaps_rollup, Linux >= 4.14)."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0]) * 1024
    return {"rss": fields["Rss"], "pss": fields["Pss"],
            "uss": fields["Private_Clean"] + fields["Private_Dirty"]}


def maps_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def sample(driver: int) -> dict:
    """One reading of every process of the job, grouped as actors / other Ray processes / driver."""
    groups: dict[str, list[dict]] = {"actors": [], "ray": [], "driver": []}
    for pid in descendants(driver):
        try:
            name = title(pid)
            mem = memory(pid)
            torch = maps_torch(pid) if name.startswith(ACTOR) else False
        except (OSError, ValueError, KeyError):  # exited between listing and reading
            continue
        group = "driver" if pid == driver else ("actors" if name.startswith(ACTOR) else "ray")
        groups[group].append({"pid": pid, "name": name.split()[0] if name else "?", "torch": torch, **mem})
    return groups


def total(procs: list[dict], key: str) -> int:
    return sum(p[key] for p in procs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--group", type=int, default=4, help="samples per prompt of the scenario workload")
    ap.add_argument("--per-process", type=int, default=0,
                    help="emulation.devices_per_process (0: the config's auto; 1: a process per device)")
    ap.add_argument("--time-scale", type=float, default=0.01, help="wall seconds slept per modelled second")
    ap.add_argument("--scenario", default="streamrl-pipeline")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between memory readings")
    ap.add_argument("--timeout", type=float, default=1800, help="give up on the job after this many seconds")
    ap.add_argument("--pythonpath", help="import poise from this source directory instead (before/after)")
    ap.add_argument("--bare-ray", action="store_true", help="measure --devices Ray actors that import nothing "
                                                             "(Ray's own floor) instead of the job")
    args = ap.parse_args()

    samples = args.devices * args.group
    per = EmulationConfig(devices_per_process=args.per_process).per_process(args.devices)
    processes = args.devices if args.bare_ray else -(-args.devices // per)
    overrides = [
        "run.progress=false", f"run.steps={args.steps}", "run.dir=runs/bench-emulated-memory", "run.overwrite=true",
        "run.checkpoint_every=0", "cluster.compute=emulated", f"cluster.devices={args.devices}",
        "pipeline.mode=sync", f"algorithm.micro_batch_size={max(1, samples // args.devices)}",
        f"emulation.scenario={args.scenario}", f"emulation.time_scale={args.time_scale}",
        f"emulation.devices_per_process={args.per_process}",
        f"emulation.overrides=[workload.prompts_per_step={args.devices}, "
        f"workload.samples_per_prompt={args.group}]"]
    command = ([sys.executable, "-c", BARE_RAY, str(args.devices)] if args.bare_ray
               else [sys.executable, "-m", "poise", "train", *overrides])
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(args.pythonpath).resolve()), env.get("PYTHONPATH", "")])
    print("bare Ray actors" if args.bare_ray else " ".join(command[2:]), flush=True)

    t0 = time.perf_counter()
    job = subprocess.Popen(command, env=env)
    readings, all_up_s, torch_pids = [], None, set()
    while job.poll() is None:
        if time.perf_counter() - t0 > args.timeout:
            job.terminate()
            job.wait(30)
            raise SystemExit(f"the job ran past --timeout {args.timeout:g} s; it was stopped")
        began = time.perf_counter()
        groups = sample(job.pid)
        t = time.perf_counter() - t0
        actors = groups["actors"]
        torch_pids |= {p["pid"] for p in actors if p["torch"]}
        if all_up_s is None and len(actors) >= processes:
            all_up_s = t
        readings.append({"t": t, "actors": len(actors),
                         **{f"{g}_{k}": total(procs, k) for g, procs in groups.items() for k in ("rss", "pss", "uss")}})
        time.sleep(max(0.0, args.interval - (time.perf_counter() - began)))  # one reading per interval
    wall = time.perf_counter() - t0
    if job.returncode != 0:
        raise SystemExit(f"the job failed (exit {job.returncode}); see its output above")

    peak = {k: max(r[k] for r in readings) for k in readings[0] if k not in ("t", "actors")}
    at = max(readings, key=lambda r: r["actors_pss"])  # the reading with the actors' peak PSS
    n = max(1, at["actors"])
    rows = [("actors (sum)", peak["actors_rss"], peak["actors_pss"], peak["actors_uss"]),
            ("per process (mean)", at["actors_rss"] / n, at["actors_pss"] / n, at["actors_uss"] / n),
            ("other Ray processes", peak["ray_rss"], peak["ray_pss"], peak["ray_uss"]),
            ("driver", peak["driver_rss"], peak["driver_pss"], peak["driver_uss"])]
    what = (f"{args.devices} bare Ray actors" if args.bare_ray else
            f"{args.devices} emulated devices in {processes} processes, {args.steps} steps, {samples} samples/step, {args.scenario}, "
            f"time scale {args.time_scale:g}")
    print(f"\n{what}; {len(readings)} readings every {args.interval:g} s")
    print(f"{'peak MiB':<22} {'RSS':>9} {'PSS':>9} {'USS':>9}")
    for name, rss, pss, uss in rows:
        print(f"{name:<22} {rss / MB:>9.0f} {pss / MB:>9.0f} {uss / MB:>9.0f}")
    print(f"actors seen at once: {max(r['actors'] for r in readings)}; all up after "
          f"{'%.0f s' % all_up_s if all_up_s is not None else 'never'} ({processes} processes); job wall {wall:.0f} s; "
          f"actors mapping libtorch: {len(torch_pids)}")
    write_results("emulated_memory", {
        "args": vars(args), "command": command[2:], "wall_s": wall, "all_actors_up_s": all_up_s,
        "actors_with_torch": len(torch_pids), "peak_bytes": peak, "per_actor_at_peak_pss_bytes":
            {k: at[f"actors_{k}"] / n for k in ("rss", "pss", "uss")}, "readings": readings})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
