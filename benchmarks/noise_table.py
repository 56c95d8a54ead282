"""Gumbel noise made per step vs made ahead (`NoiseTable`), on the peer workload's generation, interleaved.

    .venv/bin/python benchmarks/noise_table.py [--rounds 12] [--steps 3] [--threads 2] [--mode bitwise|semantic]

The model, prompts and sampling of benchmarks/peer_trl.py (a random tiny Llama, hidden 128, 2
layers, the char vocabulary of 60; `count a:b=` prompts, 4 x 8 samples per step, temperature 1, up
to 128 new tokens). One engine generates the first `--steps` steps of prompts again and again,
alternating two samplers in the same process (A B B A ...): `per-step` makes each step's noise
from the rows' keys (the engine with `noise = None`), `table` takes it from the slots' NoiseTable
(rollout/sampling.py). Wall seconds of each generation; the ratio is the median over pairs of
table / per-step. Checks that both give every token and log-prob bit for bit. Prints a table and
writes bench-results/noise_table-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from results import write_results  # benchmarks/results.py
from peer_trl import CONTENDERS, POISE  # the workload's overrides
from poise.config import load_train_config
from poise.training.colocated import ColocatedLoop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=3, help="the workload's first steps, generated each round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mode", choices=("bitwise", "semantic"), default="bitwise")
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1 or args.threads < 1:
        sys.exit(f"noise_table: --rounds {args.rounds}, --steps {args.steps} and --threads {args.threads} must be >= 1")
    run_dir = Path("runs") / "bench-noise-table"
    overrides = [o for o in CONTENDERS[args.mode] if not o.startswith("cluster.threads_per_device")]
    cfg = load_train_config(None, [*POISE, *overrides, f"cluster.threads_per_device={args.threads}",
                                   f"run.dir={run_dir}", f"run.steps={args.steps}"])
    run_dir.mkdir(parents=True, exist_ok=True)
    loop = ColocatedLoop(cfg, run_dir)
    try:
        table = loop.engine.noise
        if table is None:
            sys.exit("noise_table: the engine made no NoiseTable for this vocabulary")
        problems = [loop.steps.problems(step) for step in range(args.steps)]
        times: dict[str, list[float]] = {"per-step": [], "table": []}
        outputs: dict[tuple[str, int], list] = {}
        for r in range(args.rounds):
            for name in (("per-step", "table") if r % 2 == 0 else ("table", "per-step")):
                loop.engine.noise = table if name == "table" else None
                start = time.perf_counter()
                for step, batch in enumerate(problems):
                    samples = loop.generate(step, batch)
                    outputs[(name, step)] = [(s.token_ids, s.logprobs) for s in samples]
                times[name].append(time.perf_counter() - start)
    finally:
        loop.steps.rewards.close()
    same = all(outputs[("table", s)] == outputs[("per-step", s)] for s in range(args.steps))
    tokens = sum(len(t) for s in range(args.steps) for t, _ in outputs[("table", s)])
    ratio = statistics.median(a / b for a, b in zip(times["table"], times["per-step"]))
    print(f"{args.steps} steps of generation, {tokens} tokens, {args.mode}, {args.threads} threads, "
          f"{args.rounds} rounds; torch {torch.__version__}")
    print(f"{'sampler':>9} {'median s':>9} {'tokens/s':>9}")
    for name, xs in times.items():
        print(f"{name:>9} {statistics.median(xs):9.3f} {tokens / statistics.median(xs):9.0f}")
    print(f"table / per-step time: {ratio:.3f} (median over pairs); same tokens and log-probs: {same}")
    write_results("noise_table", {"mode": args.mode, "threads": args.threads, "steps": args.steps, "tokens": tokens,
                                  "times": times, "ratio_table_to_per_step": ratio, "identical": same,
                                  "span": table.span})
    if not same:
        sys.exit("noise_table: the two samplers disagree")


if __name__ == "__main__":
    main()
