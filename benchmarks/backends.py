"""Rollout backends side by side: Poise's engine (fast and bitwise modes) vs vLLM, on one model and
one workload. Needs vLLM: run it from `make vllm`'s venv.

    .venv-vllm/bin/python benchmarks/backends.py [--shape demo|small|qwen2.5-0.5b] [--requests 64]
                                                 [--median 32] [--slots 32] [--repeats 2] [--device cpu|cuda]

Workload: random prompts of 8-24 tokens, an output budget per request from a lognormal (median
--median tokens, sigma 1, clipped to the context; EOS-free, so every response runs to its budget:
the same tokens for every contender), sampled at temperature 1. Model: a random-init Qwen2 of
--shape (demo: the demo's tiny one; small: hidden 256, 4 layers; qwen2.5-0.5b: Qwen2.5-0.5B's
shape, for the GPU), float32 on CPU (bfloat16 on CUDA).

Per contender (the median round; rounds interleave the contenders, in reverse every other round):
- tokens/s: generated tokens over the wall seconds of the whole workload;
- first sample s: from submitting everything to the first finished sample (streaming);
- update s: a full weights update into the engine, to the point where the next step runs on it
  (Poise: `load_weights` into the module; vLLM: the same, then its reload in its own process);
- memory MiB: what generation holds besides the model: Poise's KV cache and noise table
  (`cache_bytes`); vLLM's processes' resident memory (its own copy of the model, the KV cache it
  reserves, the interpreter) measured with psutil;
- start s: the engine's first step's extra cost (vLLM starts its process then).
Prints a table, writes bench-results/backends-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import sys
import time
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import write_results  # noqa: E402

from poise.config import EngineConfig, SamplingConfig, TinyModelConfig  # noqa: E402
from poise.model.loading import build_tiny  # noqa: E402
from poise.rollout.engine import Engine  # noqa: E402
from poise.rollout.vllm_engine import VllmEngine  # noqa: E402
from poise.types import Request  # noqa: E402

SHAPES = {
    "demo": TinyModelConfig(max_positions=512),
    "small": TinyModelConfig(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=768,
                             max_positions=512),
    "qwen2.5-0.5b": TinyModelConfig(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                                    intermediate_size=4864, max_positions=4096),
}
VOCAB = {"demo": 64, "small": 4096, "qwen2.5-0.5b": 151936}


def workload(n: int, median: int, context: int, vocab: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(8, 24))]
        budget = max(1, min(context - len(prompt) - 1, round(median * math.exp(rng.gauss(0.0, 1.0)))))
        out.append(Request((0, i, 0), prompt, budget))
    return out


def children_rss() -> int:
    return sum(p.memory_info().rss for p in psutil.Process().children(recursive=True)
               if "resource_tracker" not in " ".join(p.cmdline()))


def run_once(engine, requests: list[Request], round_: int) -> dict:
    """Submit every request, step to the end; wall seconds, first-sample seconds, tokens."""
    requests = [dataclasses.replace(r, sample_id=(round_, *r.sample_id[1:])) for r in requests]
    start = time.perf_counter()
    for r in requests:
        engine.submit(r)
    first, tokens = None, 0
    while not engine.occupancy.idle:
        finished = engine.step()
        if finished and first is None:
            first = time.perf_counter() - start
        tokens += sum(len(s.token_ids) for s in finished)
    return {"seconds": time.perf_counter() - start, "first_sample_s": first, "tokens": tokens}


def update_seconds(engine, model, version: int) -> float:
    """A full weights update, until the engine has taken it (vLLM: its reload before the next step)."""
    named = [(name, p.detach().clone()) for name, p in model.named_parameters()]
    start = time.perf_counter()
    engine.load_weights(named, version)
    if isinstance(engine, VllmEngine):
        engine._push_weights()  # what its next step does first
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--median", type=int, default=32)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)  # before vLLM: its CPU backend fixes the thread count once it binds
    device = torch.device("cuda" if args.device == "cuda" else "cpu")
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    shape = SHAPES[args.shape]
    model = build_tiny(shape, VOCAB[args.shape], seed=0, eos_id=None).to(device, dtype)
    params = sum(p.numel() for p in model.parameters())
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.context)
    requests = workload(args.requests, args.median, args.context, VOCAB[args.shape])
    base = EngineConfig(num_slots=args.slots, max_context=args.context)
    engines = {
        "poise-fast": Engine(model, base, sampling, 0, None),
        "poise-bitwise": Engine(model, dataclasses.replace(base, batch_invariant=True), sampling, 0, None),
        "vllm": VllmEngine(model, dataclasses.replace(base, backend="vllm"), sampling, 0, None),
    }
    print(f"model {args.shape}: {params / 1e6:.1f}M parameters, {dtype}, {device}; {args.requests} requests, "
          f"{sum(r.max_new_tokens for r in requests)} tokens, {args.slots} slots, torch threads {args.threads}")
    start = {}
    for name, engine in engines.items():  # warm-up round: vLLM starts its process here
        t = time.perf_counter()
        run_once(engine, requests[:4], 1000)
        start[name] = time.perf_counter() - t
    rows: dict[str, list[dict]] = {name: [] for name in engines}
    for k in range(args.repeats):
        order = list(engines) if k % 2 == 0 else list(reversed(engines))
        for name in order:
            rows[name].append(run_once(engines[name], requests, k))
            rows[name][-1]["update_s"] = update_seconds(engines[name], model, k + 1)
    memory = {name: engine.cache_bytes for name, engine in engines.items() if not isinstance(engine, VllmEngine)}
    memory["vllm"] = children_rss()
    summary = {}
    for name, runs in rows.items():
        mid = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
        summary[name] = {"tokens_per_s": mid["tokens"] / mid["seconds"], "first_sample_s": mid["first_sample_s"],
                         "update_s": statistics.median(r["update_s"] for r in runs), "memory_mib": memory[name] / 2**20,
                         "start_s": start[name], "seconds": mid["seconds"], "tokens": mid["tokens"]}
    print(f"{'backend':<15}{'tokens/s':>10}{'first sample s':>16}{'update s':>10}{'memory MiB':>12}{'start s':>9}")
    for name, r in summary.items():
        print(f"{name:<15}{r['tokens_per_s']:>10.0f}{r['first_sample_s']:>16.3f}{r['update_s']:>10.3f}"
              f"{r['memory_mib']:>12.0f}{r['start_s']:>9.1f}")
    fast = summary["poise-fast"]["tokens_per_s"]
    print(f"vllm tokens/s is {summary['vllm']['tokens_per_s'] / fast:.2f}x poise-fast's")
    write_results("backends", {"args": vars(args), "parameters": params, "summary": summary, "rounds": rows})
    engines["vllm"].release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
