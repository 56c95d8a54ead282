"""The largest model each `cluster.shard` mode trains under a per-device memory limit.

    .venv/bin/python benchmarks/shard_max_model.py [--limit-mb 1536] [--world 4] [--modes none,optimizer,full]
        [--ladder 768x2,768x4,...]

`--world` gloo processes, each a train device as `shard_memory.py` builds it (`PolicyTrainer` +
`TorchTrainShard`, bitwise, 1 thread, one micro-batch of 2 x (16 + 32) tokens per device per
update, 2 updates), each in a cgroup of its own whose memory limit is `--limit-mb` with no swap
(cgroup v1 or v2, `poise.rewards.cgroup`: the kernel enforces it; a device over it is killed).
It holds from before the process imports torch, so the model's load and every transient count.
Each shape is saved once as an HF directory by this process (outside the limits) and each device
loads it as `poise train model.path=DIR` does: with `full` a device reads its own run alone
(`--built` instead builds the seeded model whole on every device, as before). For each mode the ladder of built-in shapes (`<hidden>x<layers>`) is tried
from the top down; the first shape whose run completes is the mode's largest (the ones above it
were killed, or failed). Needs root or a delegated cgroup (it says so otherwise).

Writes bench-results/shard_max_model-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue as queue_module
import shutil
import tempfile
import time

from results import write_results  # benchmarks/results.py
from shard_memory import device
from train_memory import shape_dims

LADDER = "768x2,768x4,768x6,768x8,768x12,768x16,768x20,768x24,768x32"


def limited_device(cgroup: str, *args) -> None:
    """`shard_memory.device` inside the cgroup(s) at `cgroup` (paths joined by ':')."""
    for path in cgroup.split(":"):
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    device(*args)


def parameters(shape: str) -> int:
    """The shape's parameter count (the built-in family: Qwen2, tied embeddings, char vocabulary)."""
    from train_memory import _model

    model, _ = _model(shape)
    return sum(p.numel() for p in model.parameters())


def saved(shape: str, root: str) -> str:
    """The seeded built-in model of `shape` as an HF directory under `root` (made once)."""
    from train_memory import _model

    from poise.model.loading import save_hf_weights

    path = os.path.join(root, shape)
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        model, _ = _model(shape)
        save_hf_weights(model, path)
    return path


def attempt(shape: str, shard: str, world: int, limit_mb: int, port: int, layer, timeout_s: float,
            model_dir: str | None = None) -> dict:
    """One run of `world` devices on `shape`; returns whether all completed and how each ended."""
    from poise.rewards.cgroup import WorkerCgroup

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    groups, procs = [], []
    try:
        for rank in range(world):
            group = WorkerCgroup.make(layer, f"poise-bench-{os.getpid()}-{port}-{rank}", (limit_mb - 96) // 2)
            for path in group.paths:  # gloo and torch start threads: the benchmark limits memory only
                if os.path.exists(os.path.join(path, "pids.max")):
                    with open(os.path.join(path, "pids.max"), "w") as f:
                        f.write("max")
            groups.append(group)
            procs.append(ctx.Process(target=limited_device, args=(":".join(group.paths), rank, world, port, shape,
                                                                  shard, 1, 2, 2, 32, results, model_dir)))
        t0 = time.time()
        for p in procs:
            p.start()
        rows, ok = [], True
        while len(rows) < world:
            try:
                rows.append(results.get(timeout=1.0))
                continue
            except queue_module.Empty:
                pass
            if any(p.exitcode not in (None, 0) for p in procs) or time.time() - t0 > timeout_s:
                ok = False  # one was killed (over the limit) or failed: the others wait in a collective
                break
        for p in procs:
            if ok:
                p.join()
            else:
                p.kill()
                p.join()
        codes = [p.exitcode for p in procs]
        return {"shape": shape, "shard": shard, "completed": ok and all(c == 0 for c in codes), "exit_codes": codes,
                "seconds": time.time() - t0, "devices": sorted(rows, key=lambda r: r["rank"])}
    finally:
        for group in groups:
            group.remove()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit-mb", type=int, default=1536, help="memory limit of each device process (no swap)")
    ap.add_argument("--world", type=int, default=4, help="train devices (processes)")
    ap.add_argument("--modes", default="none,optimizer,full")
    ap.add_argument("--ladder", default=LADDER, help="shapes <hidden>x<layers>, smallest first")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="a run that takes longer counts as failed")
    ap.add_argument("--built", action="store_true", help="build the seeded model whole on every device instead of "
                    "loading it from a saved directory")
    args = ap.parse_args()

    from poise.rewards.cgroup import locate

    layer, why = locate()
    if layer is None:
        raise SystemExit(f"shard_max_model: no cgroup layer to set a memory limit in ({why}); run as root or in a "
                         "delegated cgroup")
    ladder = args.ladder.split(",")
    sizes = {shape: parameters(shape) for shape in ladder}
    print(f"{args.world} train devices, each limited to {args.limit_mb} MB (cgroup v{layer.version}, no swap); "
          f"ladder: {', '.join(f'{s} ({sizes[s] / 1e6:.0f}M)' for s in ladder)}")
    runs, largest = [], {}
    port = 29800
    root = tempfile.mkdtemp(prefix="shard-max-model-")  # the saved shapes, removed at the end
    for shard in args.modes.split(","):
        for shape in reversed(ladder):
            port += 1
            model_dir = None if args.built else saved(shape, root)
            r = attempt(shape, shard, args.world, args.limit_mb, port, layer, args.timeout_s, model_dir)
            r["parameters"] = sizes[shape]
            runs.append(r)
            peaks = [d["peak_rss_mb"] for d in r["devices"]]
            print(f"  {shard:<10} {shape:>7} ({sizes[shape] / 1e6:5.0f}M): "
                  f"{'completed' if r['completed'] else 'killed or failed'} in {r['seconds']:.0f} s"
                  f"{f', peak RSS {max(peaks):.0f} MB' if peaks else ''} (exit codes {r['exit_codes']})")
            if r["completed"]:
                largest[shard] = {"shape": shape, "parameters": sizes[shape], "peak_rss_mb": max(peaks)}
                break
    print(f"\n{'shard':<10} {'largest shape':>14} {'parameters':>12} {'vs none':>8}")
    base = largest.get("none", {}).get("parameters")
    for shard, best in largest.items():
        ratio = best["parameters"] / base if base else float("nan")
        best["vs_none"] = ratio
        print(f"{shard:<10} {best['shape']:>14} {best['parameters'] / 1e6:>11.0f}M {ratio:>7.2f}x")
    shutil.rmtree(root, ignore_errors=True)
    write_results("shard_max_model", {"args": vars(args), "cgroup_version": layer.version, "sizes": sizes,
                                      "runs": runs, "largest": largest})


if __name__ == "__main__":
    main()
