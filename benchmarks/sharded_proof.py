"""DESIGN.md's proof that sharding works: a Qwen2.5-0.5B-shaped model trains sync 1+3 on one machine.

    .venv/bin/python benchmarks/sharded_proof.py [--model-dir DIR] [--limit-gb 22] [--modes full,none]

A random model of Qwen2.5-0.5B's shape (`gpu_memory.py`'s `qwen25_05b_shape(24, 151936)`, 494M
parameters, fp32, tied embeddings, built after `torch.manual_seed(0)` and saved once into
`--model-dir` with `save_hf_weights`) is trained for 2 steps by `poise train` (sync 1+3, 16
samples of 16 tokens a step, `micro_batch_size` 8, the char tokenizer) per shard mode, the whole
job (driver, Ray, the four devices) in one cgroup whose memory limit is `--limit-gb` with no swap
(`poise.rewards.cgroup`). A sampler reads every second the cgroup's anonymous memory and the RSS
of each of its processes. Per mode: whether the run completed, its wall time, the most anonymous
memory and the largest process (which one). Needs root or a delegated cgroup.

Writes bench-results/sharded_proof-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from results import write_results  # benchmarks/results.py

GB = 2**30
TRAIN = ["data.tokenizer=char", "pipeline.mode=sync", "cluster.devices=4", "cluster.split=[1,3]", "run.steps=2",
         "run.progress=false", "algorithm.prompts_per_step=4", "algorithm.group_size=4",
         "algorithm.sampling.max_new_tokens=16", "algorithm.micro_batch_size=8"]


def build_model(path: Path) -> None:
    """The 0.5B shape with random weights, saved as an HF directory (skipped if it is there)."""
    if (path / "model.safetensors").exists():
        return
    import torch
    from gpu_memory import qwen25_05b_shape
    from transformers import AutoModelForCausalLM

    from poise.model.loading import save_hf_weights

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(qwen25_05b_shape(24, 151936), attn_implementation="sdpa",
                                             dtype=torch.float32)
    save_hf_weights(model, path)


def _anon_bytes(group) -> int:
    """The cgroup's anonymous memory: `rss` of memory.stat (v1) or `anon` (v2)."""
    key = "anon" if group.version == 2 else "rss"
    with open(os.path.join(group.paths[0], "memory.stat")) as f:
        for line in f:
            name, value = line.split()
            if name == key:
                return int(value)
    return 0


def _processes(group) -> dict[int, tuple[int, str]]:
    """pid -> (RSS bytes, command line) of every process in the cgroup."""
    out = {}
    with open(os.path.join(group.paths[0], "cgroup.procs")) as f:
        pids = [int(line) for line in f if line.strip()]
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                rss = int(f.read().split()[1]) * page
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:80]
        except OSError:
            continue
        out[pid] = (rss, cmd)
    return out


def _join(paths) -> None:
    """In the child before it runs `poise`: move it into the cgroup (its children follow)."""
    for path in paths:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))


def attempt(model_dir: Path, shard: str, limit_gb: float, layer, timeout_s: float) -> dict:
    from poise.rewards.cgroup import WorkerCgroup

    group = WorkerCgroup.make(layer, f"poise-proof-{os.getpid()}-{shard}", (int(limit_gb * 1024) - 96) // 2)
    for path in group.paths:  # Ray and torch start many threads: memory is what is limited
        if os.path.exists(os.path.join(path, "pids.max")):
            with open(os.path.join(path, "pids.max"), "w") as f:
                f.write("max")
    run_dir = Path(tempfile.mkdtemp(prefix=f"proof-{shard}-"))
    peak = {"anon": 0, "rss": 0, "cmd": ""}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                peak["anon"] = max(peak["anon"], _anon_bytes(group))
                for rss, cmd in _processes(group).values():
                    if rss > peak["rss"]:
                        peak["rss"], peak["cmd"] = rss, cmd
            except OSError:
                pass
            done.wait(1.0)

    poise = Path(sys.executable).with_name("poise")
    command = [str(poise), "train", f"model.path={model_dir}", f"run.dir={run_dir}", f"cluster.shard={shard}", *TRAIN]
    sampler = threading.Thread(target=sample, daemon=True)
    t0 = time.time()
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=lambda: _join(group.paths))
        sampler.start()
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        wall = time.time() - t0
    finally:
        done.set()
        if sampler.is_alive():
            sampler.join()
        for pid in _processes(group):  # what the run left in the cgroup (Ray's processes), by PID
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        time.sleep(2)
        group.remove()
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) if (run_dir / "checkpoints").is_dir() \
        else []
    last = [line for line in output.splitlines() if line.strip()][-3:]
    shutil.rmtree(run_dir, ignore_errors=True)  # two checkpoints of ~6 GB
    return {"shard": shard, "returncode": proc.returncode, "completed": proc.returncode == 0 and "step_000002" in checkpoints,
            "wall_s": wall, "anon_max_gb": peak["anon"] / GB, "largest_rss_gb": peak["rss"] / GB,
            "largest_process": peak["cmd"], "checkpoints": checkpoints, "last_lines": last, "run_dir": str(run_dir)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default=None, help="where the random 0.5B-shaped model is (built if missing)")
    ap.add_argument("--limit-gb", type=float, default=22.0, help="memory limit of the whole job (no swap)")
    ap.add_argument("--modes", default="full,none")
    ap.add_argument("--timeout-s", type=float, default=1200.0)
    args = ap.parse_args()

    from poise.rewards.cgroup import locate

    layer, why = locate()
    if layer is None:
        raise SystemExit(f"sharded_proof: no cgroup layer to set a memory limit in ({why}); run as root or in a "
                         "delegated cgroup")
    model_dir = Path(args.model_dir or Path(tempfile.gettempdir()) / "poise-qwen25-05b-random")
    build_model(model_dir)
    print(f"model: {model_dir}; the job in one cgroup v{layer.version} of {args.limit_gb:g} GB, no swap")
    runs = []
    for shard in args.modes.split(","):
        r = attempt(model_dir, shard, args.limit_gb, layer, args.timeout_s)
        runs.append(r)
        print(f"  {shard:<10} {'completed' if r['completed'] else 'FAILED (rc %s)' % r['returncode']} in "
              f"{r['wall_s']:.0f} s; anonymous memory at most {r['anon_max_gb']:.1f} GB; largest process "
              f"{r['largest_rss_gb']:.1f} GB ({r['largest_process']})")
        if not r["completed"]:
            print("    " + "\n    ".join(r["last_lines"]))
    write_results("sharded_proof", {"args": vars(args), "cgroup_version": layer.version, "train": TRAIN, "runs": runs})


if __name__ == "__main__":
    main()
