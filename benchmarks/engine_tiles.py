"""The batch-invariant engine's fixed-shape tiles (its decoding where the matmul has no row quantum:
CUDA) on the CPU: each row attending over its key bucket, as now, against every row attending over
the whole context, as before; and the host reads a decode step makes.

    .venv/bin/python benchmarks/engine_tiles.py [--requests 128] [--batch 32] [--tile 16] [--median 16]
                                                [--context 1024] [--repeats 3]

The workload is benchmarks/engine.py's (long-tailed budgets, EOS-free, greedy), on the tiny Qwen2
with `--context` positions, one torch thread. The runner is forced to find no row quantum, so the
engine runs tiles on the CPU as it does on a GPU. "whole-context" patches the tile's key length to
the context (what every tile step read before). Runs are interleaved (every other round reversed);
times are this process's CPU seconds, medians over rounds. "keys/token" counts the (row, key)
pairs decode attention computes per generated token. Prints a table and writes
bench-results/engine-tiles-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

import poise.rollout.runner as runner_module
from poise.model.loading import TinyModelConfig, build_tiny
from poise.rollout.engine import Engine, EngineConfig
from poise.rollout.runner import DecoderRunner
from poise.rollout.sampling import SamplingConfig

sys.path.insert(0, str(Path(__file__).parent))
from engine import VOCAB, workload  # noqa: E402  (the same workload as the engine benchmark)


def run(model, requests, batch: int, tile: int, whole_context: bool) -> dict:
    bucket = runner_module.key_bucket
    keys = [0]
    attend = DecoderRunner._attend

    def counting(self, q, k, v, mask):
        keys[0] += k.shape[0] * k.shape[2]
        return attend(self, q, k, v, mask)

    DecoderRunner._attend = counting
    if whole_context:
        runner_module.key_bucket = lambda position, context: context
    try:
        engine = Engine(model, EngineConfig(num_slots=batch, batch_invariant=True, invariant_tile=tile),
                        SamplingConfig(temperature=0.0), seed=0, eos_id=None)
        assert engine.row_quantum == 0
        reads = [0]
        tolist = torch.Tensor.tolist
        torch.Tensor.tolist = lambda self: (reads.__setitem__(0, reads[0] + 1), tolist(self))[1]
        try:
            start = time.process_time()
            samples = engine.generate(requests)
            cpu = time.process_time() - start
        finally:
            torch.Tensor.tolist = tolist
    finally:
        runner_module.key_bucket, DecoderRunner._attend = bucket, attend
    tokens = sum(len(s.token_ids) for s in samples)
    return {"cpu": cpu, "tokens": tokens, "steps": engine.steps, "reads_per_step": reads[0] / engine.steps,
            "keys_per_token": keys[0] / tokens, "samples": {s.sample_id: (s.token_ids, s.logprobs) for s in samples}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tile", type=int, default=16, help="rollout.invariant_tile")
    parser.add_argument("--median", type=float, default=16.0)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench-results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    DecoderRunner.row_quantum = lambda self: 0  # tiles, as on a GPU
    model = build_tiny(TinyModelConfig(max_positions=args.context), VOCAB, seed=args.seed).eval()
    requests = workload(args.requests, args.context, args.seed, args.median)
    names = ("bucketed", "whole-context")
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for name in names:  # warm-up
        run(model, requests, args.batch, args.tile, name == "whole-context")
    for round_ in range(args.repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            runs[name].append(run(model, requests, args.batch, args.tile, name == "whole-context"))
            print(f"  round {round_ + 1} {name}: {runs[name][-1]['cpu']:.2f} s CPU", file=sys.stderr)
    ratios = [w["cpu"] / b["cpu"] for b, w in zip(runs["bucketed"], runs["whole-context"])]
    reference = runs["bucketed"][0]["samples"]
    same_tokens = all({k: t for k, (t, _) in r["samples"].items()} == {k: t for k, (t, _) in reference.items()}
                      for r in runs["whole-context"])
    same_bits = all(r["samples"] == reference for r in runs["whole-context"])
    print(f"\n{'tiles':<15}{'tokens':>8}{'steps':>7}{'CPU s':>8}{'tokens/s':>10}{'keys/token':>12}{'reads/step':>12}")
    table = {}
    for name, rs in runs.items():
        cpu = statistics.median(r["cpu"] for r in rs)
        r = rs[0]
        table[name] = {"cpu_seconds": cpu, "cpu_runs": [x["cpu"] for x in rs], "tokens": r["tokens"],
                       "steps": r["steps"], "keys_per_token": r["keys_per_token"],
                       "reads_per_step": r["reads_per_step"]}
        print(f"{name:<15}{r['tokens']:>8}{r['steps']:>7}{cpu:>8.2f}{r['tokens'] / cpu:>10.0f}"
              f"{r['keys_per_token']:>12.0f}{r['reads_per_step']:>12.2f}")
    print(f"\nwhole-context / bucketed CPU time: {statistics.median(ratios):.2f}x (rounds "
          f"{' '.join(f'{x:.2f}' for x in ratios)}); greedy tokens identical: {same_tokens}, logprobs too: "
          f"{same_bits}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    record = {"command": "benchmarks/engine_tiles.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "args": vars(args), "torch": torch.__version__, "results": table,
              "whole_context_over_bucketed": statistics.median(ratios), "rounds": ratios,
              "greedy_tokens_identical": same_tokens, "logprobs_identical": same_bits}
    path = out / f"engine-tiles-{stamp}.json"
    path.write_text(json.dumps(record, indent=2))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
