"""Reward calls per second through the sandbox pool (poise.rewards), against calling in process.

    .venv/bin/python benchmarks/reward_sandbox.py [--workers 2] [--calls 20000] [--batches 1,16,256]
        [--rounds 3] [--isolation batch|call]

A trivial user reward in a file (`path/to/file.py:score`: 1.0 if the completion equals the
answer), loaded by import path into `--workers` confined worker processes (network and PID
namespaces, Landlock, resource limits: the `confinement` line says which held). The driver
submits `--calls` samples in batches of each size in `--batches` (a batch = the samples of one
arrived stream batch; every sample is one call of the function in a worker, and one JSON answer
line back), all batches queued at once, and waits for the last; a call = one sample, one
function. Columns:

  batch      samples per submit
  calls/s    calls / wall seconds from the first submit to the last result (median of rounds)
  us/call    the inverse, per call
  latency    wall ms of one submit -> result of that batch size alone (median of 50, the pool idle)
  in-process calls/s of the same function called directly in the driver, one sample per call
  start s    the pool's start: workers spawned, confined, the function imported (once per run)

Also reports the worker restart time after a timeout (kill + fresh worker + its first answer).
Writes bench-results/reward_sandbox-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


from results import write_results  # benchmarks/results.py

from poise.config import RewardConfig, RewardFunctionConfig
from poise.rewards.scorer import RewardInput, RewardScorer

REWARD = '''
import time

def score(prompts, completions, answer, **kwargs):
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]

def sleepy(prompts, completions, **kwargs):
    time.sleep(3600)
'''


def _inputs(n: int) -> list[RewardInput]:
    return [RewardInput((0, i, 0), "sort 3 1 2", "1 2 3" if i % 2 else "1 3 2", {"answer": "1 2 3",
                                                                                   "reward_kind": "items"})
            for i in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--batches", default="1,16,256")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--isolation", default="batch", choices=["batch", "call"],
                    help="reward.isolation: a fresh call process per batch chunk or per call")
    args = ap.parse_args()
    sizes = [int(x) for x in args.batches.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "trivial_reward.py")
        path.write_text(REWARD)
        cfg = RewardConfig(functions=(RewardFunctionConfig(fn=f"{path}:score"),), workers=args.workers, timeout_s=1.0,
                           isolation=args.isolation)
        t = time.perf_counter()
        scorer = RewardScorer(cfg)
        start_s = time.perf_counter() - t
        print(f"workers {args.workers}, isolation {args.isolation}, confinement {scorer.pool.confinement}; load {os.getloadavg()[0]:.2f}")
        namespace: dict = {}
        exec(REWARD, namespace)
        fn = namespace["score"]
        rows = []
        try:
            scorer.score(_inputs(64))  # warm
            for size in sizes:
                rates = []
                for _ in range(args.rounds):
                    batches = [_inputs(size) for _ in range(max(1, args.calls // size))]
                    t = time.perf_counter()
                    pending = [scorer.submit(b) for b in batches]
                    results = [r for p in pending for r in p.result()]
                    rates.append(len(results) / (time.perf_counter() - t))
                    assert sum(r.value for r in results) == sum(i % 2 for b in batches for i in range(len(b)))
                lat = []
                for _ in range(50):
                    t = time.perf_counter()
                    scorer.score(_inputs(size))
                    lat.append(time.perf_counter() - t)
                inputs = _inputs(size)
                t = time.perf_counter()
                for _ in range(max(1, args.calls // size)):
                    for x in inputs:
                        fn([x.prompt], [x.completion], **{k: [v] for k, v in x.columns.items()})
                direct = max(1, args.calls // size) * size / (time.perf_counter() - t)
                rows.append({"batch": size, "calls_per_s": statistics.median(rates), "rounds": rates,
                             "latency_ms": 1000 * statistics.median(lat), "in_process_calls_per_s": direct})
        finally:
            scorer.close()

        slow = RewardConfig(functions=(RewardFunctionConfig(fn=f"{path}:sleepy"),), workers=1, timeout_s=0.5)
        with RewardScorer(slow) as s:
            t = time.perf_counter()
            (r,) = s.score(_inputs(1))
            timeout_s = time.perf_counter() - t
            t = time.perf_counter()
            s.pool._workers[0].start()
            s.pool._workers[0].wait_ready()
            restart_s = time.perf_counter() - t
            assert r.failures

    print(f"\n{'batch':>6} {'calls/s':>10} {'us/call':>8} {'latency ms':>11} {'in-process calls/s':>19}")
    for row in rows:
        print(f"{row['batch']:>6} {row['calls_per_s']:>10.0f} {1e6 / row['calls_per_s']:>8.1f} "
              f"{row['latency_ms']:>11.2f} {row['in_process_calls_per_s']:>19.0f}")
    print(f"\npool start {start_s:.3f} s ({args.workers} workers); a 0.5 s timeout answered after {timeout_s:.3f} s; "
          f"a replacement worker ready in {restart_s:.3f} s")
    write_results("reward_sandbox", {"workers": args.workers, "isolation": args.isolation, "calls": args.calls, "rounds": args.rounds,
                                     "confinement": scorer.pool.confinement, "start_s": start_s,
                                     "timeout_answer_s": timeout_s, "restart_s": restart_s, "rows": rows,
                                     "load_1min": os.getloadavg()[0], "cpus": os.cpu_count()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
