"""Rollout engine vs HF `generate` vs a bare batched forward loop, on a long-tailed workload.

    .venv/bin/python benchmarks/engine.py [--requests 512] [--batch 32] [--repeats 3]

Workload. A random-init model never stops on its own at realistic lengths, so output lengths
are forced: each request gets max_new_tokens drawn from a lognormal (median 16 tokens, sigma 1.0,
so p99/median ~ 10, clipped to the context), and the workload is EOS-free (every response runs
exactly to its budget). That is the long tail RL rollouts see, with the length decided up front
instead of by the model; all three contenders generate exactly the same number of tokens.
Prompts: random token ids, 8-24 tokens. Greedy decoding everywhere. Model: the default tiny
Qwen2 (`TinyModelConfig()`), float32, on CPU with the torch threads given by --threads.

Contenders, all at the same batch size B and counting only the budgeted tokens:
- engine: `poise.rollout.engine.Engine` with B slots, requests submitted at once;
- hf-generate: `model.generate` in static batches of B prompts (left padded), each row stopped by
  a per-row stopping criterion at its own budget, so a batch runs until its longest row ends
  (what a static batch does with EOS);
- bare-loop: the engine's own forward kernels (`DecoderRunner`) in a loop with no scheduling:
  each batch of B prompts prefilled in one forward, then ceil(batch tokens / B) decode steps with
  every row live and greedy argmax. Same prompts, same token count, zero waste: the floor for
  scheduling overhead.

Prints a table and writes bench-results/engine-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from poise.model.loading import TinyModelConfig, build_tiny
from poise.rollout.engine import Engine, EngineConfig, Request
from poise.rollout.kv_cache import KVCache
from poise.rollout.runner import DecoderRunner, StepInputs
from poise.rollout.sampling import SamplingConfig

VOCAB = 60  # the char tokenizer's vocabulary size


def workload(n: int, context: int, seed: int) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    requests = []
    for i in range(n):
        prompt_len = int(torch.randint(8, 25, (1,), generator=g))
        prompt = torch.randint(3, VOCAB, (prompt_len,), generator=g).tolist()
        length = math.exp(math.log(16.0) + 1.0 * float(torch.randn((), generator=g)))
        budget = max(1, min(context - 25, round(length)))  # 25: room for the longest prompt + 1
        requests.append(Request((0, i, 0), prompt, budget))
    return requests


def run_engine(model, requests, batch: int) -> float:
    engine = Engine(model, EngineConfig(num_slots=batch), SamplingConfig(temperature=0.0), seed=0, eos_id=None)
    start = time.perf_counter()
    samples = engine.generate(requests)
    elapsed = time.perf_counter() - start
    assert [len(s.token_ids) for s in samples] == [r.max_new_tokens for r in requests]
    return elapsed


def run_hf(model, requests, batch: int) -> float:
    from transformers import StoppingCriteria, StoppingCriteriaList

    class PerRowBudget(StoppingCriteria):
        """Row i is done once it has generated budgets[i] tokens."""

        def __init__(self, prompt_width: int, budgets: list[int]):
            self.prompt_width = prompt_width
            self.budgets = torch.tensor(budgets)

        def __call__(self, input_ids, scores, **kwargs):
            return (input_ids.shape[1] - self.prompt_width) >= self.budgets

    start = time.perf_counter()
    for lo in range(0, len(requests), batch):
        chunk = requests[lo:lo + batch]
        width = max(len(r.prompt_ids) for r in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.int64)
        mask = torch.zeros_like(ids)
        for row, r in enumerate(chunk):  # left padding, as decoder-only batch generation needs
            ids[row, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[row, width - len(r.prompt_ids):] = 1
        budgets = [r.max_new_tokens for r in chunk]
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max(budgets),
                           stopping_criteria=StoppingCriteriaList([PerRowBudget(width, budgets)]),
                           eos_token_id=None, pad_token_id=0)
    return time.perf_counter() - start


def run_bare(model, requests, batch: int, context: int) -> float:
    runner = DecoderRunner(model)
    cache = KVCache(runner.cache_shape(batch, context), runner.dtype, runner.device)
    start = time.perf_counter()
    for lo in range(0, len(requests), batch):
        chunk = requests[lo:lo + batch]
        rows = len(chunk)
        steps = math.ceil(sum(r.max_new_tokens for r in chunk) / rows)
        logits = runner.forward(StepInputs(prefills=[(i, list(r.prompt_ids)) for i, r in enumerate(chunk)]), cache)
        tokens = logits.argmax(-1).tolist()
        positions = [len(r.prompt_ids) for r in chunk]
        for _ in range(steps - 1):
            step = StepInputs(list(range(rows)), tokens, positions, attend_lo=0, attend_hi=rows,
                              attend_len=max(positions) + 1)
            tokens = runner.forward(step, cache).argmax(-1).tolist()
            positions = [p + 1 for p in positions]
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per contender; the median is reported")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench-results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    model_cfg = TinyModelConfig()
    model = build_tiny(model_cfg, VOCAB, seed=args.seed).eval()
    context = model_cfg.max_positions
    requests = workload(args.requests, context, args.seed)
    lengths = sorted(r.max_new_tokens for r in requests)
    median = statistics.median(lengths)
    p99 = lengths[min(len(lengths) - 1, math.ceil(0.99 * len(lengths)) - 1)]
    tokens = sum(lengths)
    print(f"workload: {len(requests)} requests, {tokens} output tokens, length median {median}, "
          f"p99 {p99} (p99/median {p99 / median:.1f}), max {lengths[-1]}; batch {args.batch}; "
          f"threads {args.threads}", file=sys.stderr)

    contenders = {
        "engine": lambda: run_engine(model, requests, args.batch),
        "hf-generate": lambda: run_hf(model, requests, args.batch),
        "bare-loop": lambda: run_bare(model, requests, args.batch, context),
    }
    results = {}
    for name, fn in contenders.items():
        fn() if name != "hf-generate" else None  # warm-up (HF is slow enough to need none)
        times = []
        for r in range(args.repeats):
            times.append(fn())
            print(f"  {name} run {r + 1}/{args.repeats}: {times[-1]:.2f} s", file=sys.stderr)
        seconds = statistics.median(times)
        results[name] = {"seconds": seconds, "runs": times, "tokens_per_second": tokens / seconds}

    engine_tps = results["engine"]["tokens_per_second"]
    ratios = {"engine_vs_hf_generate": engine_tps / results["hf-generate"]["tokens_per_second"],
              "engine_vs_bare_loop": engine_tps / results["bare-loop"]["tokens_per_second"]}
    print(f"\n{'contender':<14}{'seconds':>10}{'tokens/s':>12}{'engine is':>12}")
    for name, r in results.items():
        print(f"{name:<14}{r['seconds']:>10.3f}{r['tokens_per_second']:>12.0f}"
              f"{engine_tps / r['tokens_per_second']:>11.2f}x")
    print(f"\nacceptance: engine/hf-generate {ratios['engine_vs_hf_generate']:.2f}x (need >= 3), "
          f"engine/bare-loop {ratios['engine_vs_bare_loop']:.2f}x (need >= 0.85)")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    record = {
        "command": "benchmarks/engine.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "args": vars(args),
        "workload": {"requests": len(requests), "output_tokens": tokens, "median": median, "p99": p99,
                     "p99_over_median": p99 / median, "max": lengths[-1]},
        "model": {"arch": model_cfg.arch, "hidden": model_cfg.hidden_size, "layers": model_cfg.num_layers},
        "torch": torch.__version__,
        "results": results,
        "ratios": ratios,
    }
    path = out / f"engine-{stamp}.json"
    path.write_text(json.dumps(record, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
