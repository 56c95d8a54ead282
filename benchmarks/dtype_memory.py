"""What `model.dtype: bfloat16` changes on a rollout device: weight bytes, KV cache bytes, weight-sync
bytes, and the engine's speed, against float32, side by side in one process.

    .venv/bin/python benchmarks/dtype_memory.py [--shape 27m|100m] [--requests 16] [--rounds 3]

A random model of the built-in family (`benchmarks/train_memory.py` shapes) in each dtype; one
engine per dtype with the same slots and context (KV cache built at the first request); the same
requests generated `--rounds` times, interleaved, 1 torch thread. Bytes are the tensors' own
(parameters, `Engine.cache_bytes`); the weight sync sends the parameters in the compute dtype.
Writes bench-results/dtype_memory-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import time

import torch

from results import write_results  # benchmarks/results.py
from train_memory import _model

MB = 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="27m")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from poise.config import EngineConfig, SamplingConfig
    from poise.rollout.engine import Engine
    from poise.types import Request

    torch.set_num_threads(1)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens)
    engines, rows = {}, {}
    for name in ("float32", "bfloat16"):
        model, tok = _model(args.shape)
        model = model.to(getattr(torch, name)).eval()
        engines[name] = Engine(model, EngineConfig(num_slots=args.slots, max_context=16 + args.max_new_tokens,
                                                   batch_invariant=True), sampling, seed=0, eos_id=None)
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        rows[name] = {"dtype": name, "weights_bytes": weights, "sync_bytes": weights, "seconds": []}
    g = torch.Generator().manual_seed(0)
    vocab = tok.vocab_size
    reqs = [Request((0, i, 0), torch.randint(4, vocab, (16,), generator=g).tolist()) for i in range(args.requests)]
    for _ in range(args.rounds):  # interleaved: the machine's noise falls on both
        for name, engine in engines.items():
            t = time.perf_counter()
            engine.generate(reqs)
            rows[name]["seconds"].append(time.perf_counter() - t)
            rows[name]["cache_bytes"] = engine.cache_bytes
    fp32, bf16 = rows["float32"], rows["bfloat16"]
    print(f"\n{args.shape}: {args.requests} requests of 16 + {args.max_new_tokens} tokens, {args.slots} slots, "
          f"{args.rounds} interleaved rounds, 1 thread")
    print(f"{'dtype':<9} {'weights MB':>11} {'KV cache MB':>12} {'sync MB':>8} {'best s':>7}")
    for r in rows.values():
        r["best_s"] = min(r["seconds"])
        print(f"{r['dtype']:<9} {r['weights_bytes'] / MB:>11.1f} {r['cache_bytes'] / MB:>12.2f} "
              f"{r['sync_bytes'] / MB:>8.1f} {r['best_s']:>7.2f}")
    ratios = {k: bf16[k] / fp32[k] for k in ("weights_bytes", "cache_bytes", "sync_bytes", "best_s")}
    print("bfloat16 / float32: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    write_results("dtype_memory", {"args": vars(args), "rows": list(rows.values()), "ratios": ratios})


if __name__ == "__main__":
    main()
