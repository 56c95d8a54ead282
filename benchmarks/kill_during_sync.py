"""A device killed at a random moment of a weight sync: seconds to detect it, seconds to recover,
and whether the run still ends byte-identical to the undisturbed one, at the default deadline.

    .venv/bin/python benchmarks/kill_during_sync.py [--kills 10] [--steps 3] [--seed 0] [--bucket-mb 0.05]

Real compute on 4 CPU devices, sync 2+2 (devices 0, 1 roll out; 2, the leader, and 3 train), the
built-in tiny Qwen2 with random weights, 4 prompts x 4 samples of 12 new tokens, a checkpoint per
step, `cluster.step_timeout_s` left at its default (600 s). First one undisturbed run; its weight
syncs (`sync_s` of each step, the leader's broadcast of `--bucket-mb` buckets to both rollout
devices) give the window to kill in. Then `--kills` runs, each killing one device of the sync (a
rollout device or the leader, drawn with `--seed`) at a moment drawn uniformly within the longest
sync of the undisturbed run, in a step drawn from the run's steps: the fault tests' `sync` kill
(tests/fault_injection.py), where the device SIGKILLs its own process that many seconds into its
sync (or at the sync's end if it is over sooner).

Per kill: `detect_s` (the kill to the driver's recovery start), `recover_s` (replica saved, every
actor replaced, state loaded), `silent` (survivors that did not answer the recovery's probe: stuck in
the broadcast with the dead device, which gloo gives up only after step_timeout_s), and `identical`:
every sample's tokens, logprobs and weights version and every checkpoint's model and optimizer
bytes equal the undisturbed run's. Bad arguments: one line, exit 2.

Writes bench-results/kill_during_sync-<timestamp>.json; runs under runs/bench-kill-sync-*.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

from results import write_results  # benchmarks/results.py
from poise.config import load_train_config
from poise.runtime.driver import train_disaggregated
from poise.runtime.faults import RunFailure

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fault_injection import injected  # noqa: E402 - tests/fault_injection.py, the fault tests' injector

TINY = ["run.progress=false", "run.log_tokens=true", "run.checkpoint_every=1", "run.overwrite=true",
        "algorithm.prompts_per_step=4", "algorithm.group_size=4", "algorithm.micro_batch_size=3",
        "algorithm.sampling.max_new_tokens=12", "rollout.num_slots=8", "cluster.devices=4", "cluster.split=[2,2]",
        "pipeline.mode=sync"]
SYNC_DEVICES = (0, 1, 2)  # the rollout devices and the train leader: every party of the sync


def run(name: str, extra: list[str], kill: str | None = None) -> tuple[float, Path, BaseException | None]:
    run_dir = Path(f"runs/bench-kill-sync-{name}")
    t = time.perf_counter()
    error = None
    try:
        with injected(kill=kill or ""):
            train_disaggregated(load_train_config(None, [*TINY, f"run.dir={run_dir}", *extra]))
    except RunFailure as e:
        error = e
    return time.perf_counter() - t, run_dir, error


def events(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def fingerprint(run_dir: Path) -> str:
    """sha256 of every sample (id, tokens, logprobs, weights version; a replayed step's samples
    must repeat themselves) and every checkpoint's model and optimizer bytes."""
    samples: dict[tuple, list] = {}
    for e in events(run_dir):
        if e["kind"] == "sample":
            value = [e["tokens"], e["logprobs"], e["weights_version"]]
            if samples.setdefault(tuple(e["id"]), value) != value:
                return f"sample {e['id']} differs when replayed"
    h = hashlib.sha256(json.dumps(sorted(samples.items())).encode())
    for ckpt in sorted((run_dir / "checkpoints").glob("step_*")):
        for name in ("model.safetensors", "optimizer.safetensors"):
            h.update(ckpt.name.encode() + (ckpt / name).read_bytes())
    return h.hexdigest()


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # bad input: one line, exit 2 (argparse prints its usage too)
        print(f"kill_during_sync: {message}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="draws the device, step and moment of each kill")
    p.add_argument("--bucket-mb", type=float, default=0.05, help="rollout.weight_bucket_mb: the sync's buckets")
    args = p.parse_args()
    if args.kills < 1 or args.steps < 1 or args.bucket_mb <= 0:
        print(f"kill_during_sync: --kills {args.kills}, --steps {args.steps} must be >= 1 and --bucket-mb "
              f"{args.bucket_mb:g} > 0", file=sys.stderr)
        sys.exit(2)
    extra = [f"run.steps={args.steps}", f"rollout.weight_bucket_mb={args.bucket_mb}"]
    base_s, base_dir, error = run("undisturbed", extra)
    if error is not None:
        raise error
    base = fingerprint(base_dir)
    window = max(e["sync_s"] for e in events(base_dir) if e["kind"] == "step")
    rng = random.Random(args.seed)
    rows = []
    for i in range(args.kills):
        device, step, after = rng.choice(SYNC_DEVICES), rng.randrange(args.steps), rng.uniform(0, window)
        kill = f"sync:{step}:{device}:{after:.6f}"
        wall, run_dir, error = run(f"{i}", extra, kill)
        recovery = [e for e in events(run_dir) if e["kind"] == "recovery"]
        r = recovery[0] if recovery else {}
        rows.append({"kill": kill, "device": device, "step": step, "after_ms": after * 1e3,
                     "killed": r.get("killed"), "detect_s": r.get("detect_s"), "recover_s": r.get("recover_s"),
                     "silent": r.get("silent"), "recoveries": len(recovery), "extra_s": wall - base_s,
                     "identical": error is None and fingerprint(run_dir) == base,
                     "error": str(error) if error else None})
    timeout_s = load_train_config(None, TINY).cluster.step_timeout_s  # the default: no test's deadline
    out = {"steps": args.steps, "seed": args.seed, "bucket_mb": args.bucket_mb, "step_timeout_s": timeout_s,
           "undisturbed_s": base_s, "sync_window_ms": window * 1e3, "kills": rows,
           "identical": sum(r["identical"] for r in rows),
           "detected_within_30_s": sum(r["detect_s"] is not None and r["detect_s"] < 30 for r in rows)}
    report(out)
    write_results("kill_during_sync", out)


def report(out: dict) -> None:
    def num(v, width: int = 9) -> str:
        return f"{v:{width}.2f}" if isinstance(v, (int, float)) else f"{'-':>{width}}"

    print(f"{'#':>2} {'device':>6} {'step':>4} {'killed':34} {'detect_s':>9} {'recover_s':>9} {'silent':>7} "
          f"{'identical':>9}")
    for i, r in enumerate(out["kills"]):
        print(f"{i:>2} {r['device']:>6} {r['step']:>4} {str(r['killed'] or r['error'] or '-')[:34]:34} "
              f"{num(r['detect_s'])} {num(r['recover_s'])} {str(r['silent'] or '-'):>7} {str(r['identical']):>9}")
    n = len(out["kills"])
    print(f"undisturbed {out['undisturbed_s']:.1f} s ({out['steps']} steps), longest sync {out['sync_window_ms']:.1f} "
          f"ms; detected within 30 s: {out['detected_within_30_s']}/{n}; byte-identical: {out['identical']}/{n}")


if __name__ == "__main__":
    main()
