"""Faults on the runtime (issue 11): which worker deaths a run survives, how fast a death is
detected and how long the recovery takes; how fast a hung worker and an unrecoverable death stop
the run.

    .venv/bin/python benchmarks/runtime_faults.py [--steps 4] [--timeout 10] [--modes sync,async] [--no-stops]

Real compute on 4 CPU devices split 2+2 (a random tiny Qwen2, 4 prompts x 4 samples, 12 new
tokens, a checkpoint per step). For sync and async: one undisturbed run, then one run per kill
case (the fault tests' injector, tests/fault_injection.py: a real `ray.kill` at an exact phase): a rollout device during
generation, a train device during its micro-batches, the train leader during the weight
publish, the leader before a checkpoint. Each killed run is compared with the undisturbed one
(model and optimizer bytes of the last checkpoint); its `recovery` event gives the seconds from
the kill to its detection and the seconds to recover (replica saved, every actor replaced,
state loaded); `extra_s` is the killed run's wall time minus the undisturbed run's. Then a hung
train device (its `hang`, cluster.step_timeout_s=--timeout) and the death of the only train
device of a 1+1 run: seconds from the start of the run to its one-line error.

Writes bench-results/runtime_faults-<timestamp>.json; runs under runs/bench-faults-*.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from results import write_results  # benchmarks/results.py
from poise.config import load_train_config
from poise.runtime.driver import train_disaggregated
from poise.runtime.faults import RunFailure

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fault_injection import injected  # noqa: E402 - tests/fault_injection.py, the fault tests' injector

TINY = ["run.progress=false", "run.checkpoint_every=1", "run.overwrite=true", "algorithm.prompts_per_step=4",
        "algorithm.group_size=4", "algorithm.micro_batch_size=3", "algorithm.sampling.max_new_tokens=12",
        "rollout.num_slots=8", "cluster.devices=4", "cluster.split=[2,2]"]
# (name, device killed, phase) at step 1; in async "generate" is step 2's generation, run during step 1
CASES = [("rollout during generation", 0, "generate"), ("train during micro-batches", 3, "train"),
         ("leader during publish", 2, "publish"), ("leader before checkpoint", 2, "checkpoint")]


def run(name: str, extra: list[str], faults: dict[str, str] | None = None
        ) -> tuple[float, Path, BaseException | None]:
    run_dir = Path(f"runs/bench-faults-{name}")
    t = time.perf_counter()
    error = None
    try:
        with injected(**(faults or {})):
            train_disaggregated(load_train_config(None, [*TINY, f"run.dir={run_dir}", *extra]))
    except RunFailure as e:
        error = e
    return time.perf_counter() - t, run_dir, error


def final_digest(run_dir: Path) -> str:
    last = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    return hashlib.sha256((last / "model.safetensors").read_bytes() + (last / "optimizer.safetensors").read_bytes()
                          ).hexdigest()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--timeout", type=float, default=10.0, help="cluster.step_timeout_s of the hang case")
    p.add_argument("--modes", default="sync,async", help="pipeline modes to kill workers in")
    p.add_argument("--no-stops", action="store_true", help="skip the hang and the unrecoverable case")
    args = p.parse_args()
    rows, out = [], {"steps": args.steps}
    for mode in args.modes.split(","):
        extra = [f"pipeline.mode={mode}", f"run.steps={args.steps}"]
        base_s, base_dir, _ = run(f"{mode}-undisturbed", extra)
        digest = final_digest(base_dir)
        for name, device, phase in CASES:
            step = 2 if (mode, phase) == ("async", "generate") else 1
            wall, run_dir, error = run(f"{mode}-{phase}", extra, {"kill": f"{phase}:{step}:{device}"})
            ev = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
            rec = [e for e in ev if e["kind"] == "recovery"]
            rows.append({"mode": mode, "case": name, "device": device, "survived": error is None and bool(rec),
                         "identical": error is None and final_digest(run_dir) == digest,
                         "detect_s": rec[0]["detect_s"] if rec else None,
                         "recover_s": rec[0]["recover_s"] if rec else None, "extra_s": wall - base_s,
                         "error": str(error) if error else None})
        out[f"{mode}_undisturbed_s"] = base_s
    out["hang"] = out["unrecoverable"] = {"wall_s": float("nan"), "error": "skipped"}
    if not args.no_stops:
        stops(args, out)
    out["cases"] = rows
    report(args, out)
    write_results("runtime_faults", out)


def stops(args, out: dict) -> None:
    wall, _, error = run("hang", ["pipeline.mode=sync", "run.steps=2", "cluster.devices=2", "cluster.split=[1,1]",
                                  f"cluster.step_timeout_s={args.timeout}"], {"hang": "train:1:1"})
    out["hang"] = {"step_timeout_s": args.timeout, "wall_s": wall, "error": str(error) if error else None}
    wall, _, error = run("last-train", ["pipeline.mode=sync", "run.steps=2", "cluster.devices=2",
                                        "cluster.split=[1,1]"], {"kill": "train:1:1"})
    out["unrecoverable"] = {"wall_s": wall, "error": str(error) if error else None}


def report(args, out: dict) -> None:
    rows = out["cases"]
    print(f"{'mode':6} {'kill':28} {'survived':>8} {'identical':>9} {'detect_s':>9} {'recover_s':>9} {'extra_s':>8}")
    for r in rows:
        fmt = lambda v: f"{v:9.2f}" if isinstance(v, float) else f"{'-':>9}"  # noqa: E731
        print(f"{r['mode']:6} {r['case']:28} {str(r['survived']):>8} {str(r['identical']):>9} {fmt(r['detect_s'])} "
              f"{fmt(r['recover_s'])} {r['extra_s']:8.1f}")
    print("undisturbed: " + ", ".join(f"{m} {out[f'{m}_undisturbed_s']:.1f} s" for m in args.modes.split(","))
          + f" ({args.steps} steps)")
    print(f"hung train device, step_timeout_s={args.timeout:g}: stopped after {out['hang']['wall_s']:.1f} s: "
          f"{out['hang']['error']}")
    print(f"only train device killed: stopped after {out['unrecoverable']['wall_s']:.1f} s: "
          f"{out['unrecoverable']['error']}")


if __name__ == "__main__":
    main()
