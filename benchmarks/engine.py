"""Rollout engine vs HF `generate` vs a bare batched forward loop, on a long-tailed workload.

    .venv/bin/python benchmarks/engine.py [--requests 512] [--batch 32] [--repeats 3] [--median 16] [--context 256]
                                          [--device cpu|cuda]

Workload. A random-init model never stops on its own at realistic lengths, so output lengths
are forced: each request gets max_new_tokens drawn from a lognormal (median --median tokens,
default 16, sigma 1.0, so p99/median ~ 10, clipped to the context), and the workload is EOS-free
(every response runs exactly to its budget). That is the long tail RL rollouts see, with the length decided up front
instead of by the model.
Prompts: random token ids, 8-24 tokens. Greedy decoding everywhere. Model: the default tiny
Qwen2 (`TinyModelConfig()`, max_position_embeddings --context), float32, on CPU with the torch
threads given by --threads.

Contenders, all at the same batch size B, the same prompts and the same budgets:
- engine-fast: `poise.rollout.engine.Engine` with B slots, requests submitted at once, in the fast
  mode (`batch_invariant: false`, what `determinism: semantic` runs);
- engine-bitwise: the same with `batch_invariant: true` (what the default `determinism: bitwise`
  runs): bit-identical tokens and logprobs whatever the batch;
- hf-generate: `model.generate` in static batches of B prompts (left padded), each row stopped by
  a per-row stopping criterion at its own budget, so a batch runs until its longest row ends
  (what a static batch does with EOS);
- bare-loop: the engine's own forward kernels (`DecoderRunner`) in a plain loop with no
  scheduling: each static batch of B prompts is prefilled in one forward, then all B rows decode
  (greedy argmax) until the batch's longest budget, with contexts growing as in the workload.
  Every computed row counts as a token: this is the raw throughput of the forward at batch B.
  No scheduler reaches it on a long tail: once the queue is empty the slots drain, so the engine's
  batch occupancy (tokens / (steps * B), printed) caps its share of this rate at equal step cost,
  and each engine step also prefills the prompts that bare-loop prefills in big batches.
- bare-ideal: the same kernels, but each batch runs only ceil(its tokens / B) steps, so every
  row is useful and all contexts stay short (lockstep). No scheduler reaches this on a ragged
  workload: it ignores the drain tail and the longer contexts that long sequences attend over.
- bare-replay: the exact sequence of forwards the engine's schedule ran (recorded from a warm-up
  run), replayed with argmax and nothing else: the floor for the engine's own scheduling,
  sampling and bookkeeping overhead (the acceptance comparator for the 0.85x item).

Runs are interleaved (one of each contender per round, every other round in reverse) so load
drift on a shared machine hits all alike; times are CPU seconds of this process (one torch
thread: the work's own time, without what other processes take; wall is shown too), the table
shows each contender's median round, and "engine is" is the median over rounds of that round's
ratio (for engine-bitwise too: "bitwise is" ; its ratio to engine-fast is the cost of bit-exactness).
A breakdown then replays the fast engine's schedule to say where its forward time goes (drain
tail, and what ragged decode attention saves over attending the longest live context). Prints a
table and writes bench-results/engine-<timestamp>.json.

--device cuda runs everything on the GPU; times are then wall seconds after a device sync (CPU
seconds of the host mean little there), and the ratios are of wall time.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from poise.model.loading import TinyModelConfig, build_tiny
from poise.rollout.engine import Engine, EngineConfig
from poise.rollout.kv_cache import KVCache
from poise.rollout.runner import DecoderRunner, StepInputs
from poise.rollout.sampling import SamplingConfig
from poise.types import Request

VOCAB = 60  # the char tokenizer's vocabulary size


def workload(n: int, context: int, seed: int, median: float = 16.0) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    requests = []
    for i in range(n):
        prompt_len = int(torch.randint(8, 25, (1,), generator=g))
        prompt = torch.randint(3, VOCAB, (prompt_len,), generator=g).tolist()
        length = math.exp(math.log(median) + 1.0 * float(torch.randn((), generator=g)))
        budget = max(1, min(context - 25, round(length)))  # 25: room for the longest prompt + 1
        requests.append(Request((0, i, 0), prompt, budget))
    return requests


class Timer:
    """Wall seconds and this process's CPU seconds. With one torch thread, CPU seconds are the
    time the work took without the time other processes on a shared machine stole from it.
    On CUDA the work is synchronised before each reading."""

    sync = staticmethod(lambda: None)

    def __enter__(self) -> "Timer":
        self.sync()
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.sync()
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def run_engine(model, requests, batch: int, record: list | None = None,
               bitwise: bool = False) -> tuple[Timer, int]:
    engine = Engine(model, EngineConfig(num_slots=batch, batch_invariant=bitwise), SamplingConfig(temperature=0.0),
                    seed=0, eos_id=None)
    if record is not None:  # keep every forward the schedule ran, for the replay floor
        forward = engine.runner.forward
        engine.runner.forward = lambda step, cache: (record.append(copy.deepcopy(step)), forward(step, cache))[1]
    with Timer() as timer:
        samples = engine.generate(requests)
    assert [len(s.token_ids) for s in samples] == [r.max_new_tokens for r in requests]
    return timer, sum(len(s.token_ids) for s in samples)


def run_hf(model, requests, batch: int) -> tuple[Timer, int]:
    from transformers import StoppingCriteria, StoppingCriteriaList

    class PerRowBudget(StoppingCriteria):
        """Row i is done once it has generated budgets[i] tokens."""

        def __init__(self, prompt_width: int, budgets: list[int]):
            self.prompt_width = prompt_width
            self.budgets = torch.tensor(budgets, device=model.device)

        def __call__(self, input_ids, scores, **kwargs):
            return (input_ids.shape[1] - self.prompt_width) >= self.budgets

    with Timer() as timer:
        for lo in range(0, len(requests), batch):
            chunk = requests[lo:lo + batch]
            width = max(len(r.prompt_ids) for r in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.int64, device=model.device)
            mask = torch.zeros_like(ids)
            for row, r in enumerate(chunk):  # left padding, as decoder-only batch generation needs
                ids[row, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, device=model.device)
                mask[row, width - len(r.prompt_ids):] = 1
            budgets = [r.max_new_tokens for r in chunk]
            with torch.inference_mode():
                model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max(budgets),
                               stopping_criteria=StoppingCriteriaList([PerRowBudget(width, budgets)]),
                               eos_token_id=None, pad_token_id=0)
    return timer, sum(r.max_new_tokens for r in requests)


def run_bare(model, requests, batch: int, context: int, ideal: bool) -> tuple[Timer, int]:
    """(time, tokens counted): see the module docstring for the two variants."""
    runner = DecoderRunner(model)
    cache = KVCache(runner.cache_shape(batch, context), runner.dtype, runner.device)
    counted = 0
    with Timer() as timer:
        for lo in range(0, len(requests), batch):
            chunk = requests[lo:lo + batch]
            rows = len(chunk)
            budgets = [r.max_new_tokens for r in chunk]
            steps = math.ceil(sum(budgets) / rows) if ideal else max(budgets)
            counted += sum(budgets) if ideal else rows * steps
            prefill = StepInputs(prefills=[(i, list(r.prompt_ids)) for i, r in enumerate(chunk)])
            tokens = runner.forward(prefill, cache).argmax(-1).tolist()
            positions = [len(r.prompt_ids) for r in chunk]
            for _ in range(steps - 1):
                step = StepInputs(list(range(rows)), tokens, positions)
                tokens = runner.forward(step, cache).argmax(-1).tolist()
                positions = [p + 1 for p in positions]
    return timer, counted


def run_replay(model, steps: list[StepInputs], batch: int, context: int, tokens: int) -> tuple[Timer, int]:
    """The engine's own forwards, replayed in a bare loop (argmax only, no scheduling)."""
    runner = DecoderRunner(model)
    cache = KVCache(runner.cache_shape(batch, context), runner.dtype, runner.device)
    with Timer() as timer:
        for step in steps:
            runner.forward(step, cache).argmax(-1).tolist()
    return timer, tokens


def breakdown(model, steps: list[StepInputs], batch: int, context: int, repeats: int) -> dict:
    """Where the engine's forwards go, from timed replays of its schedule (CPU seconds):

    - drain_tail: share of the replay spent after the last admission (no queue left to refill
      the slots, the long tail runs with few live rows);
    - ragged_saving: share of the forward time that ragged decode attention saves over every
      row attending the longest live context (the same schedule replayed with one decode group);
    - full_batch_steps: the steps the same tokens take at a full batch.
    """
    runner = DecoderRunner(model)
    padded = DecoderRunner(model)
    padded.max_decode_groups = 1  # one group: every decode row attends the longest live context
    cache = KVCache(runner.cache_shape(batch, context), runner.dtype, runner.device)
    last_admission = max(i for i, step in enumerate(steps) if step.prefills)
    per_step, padded_total = [0.0] * len(steps), []
    for _ in range(repeats):
        for i, step in enumerate(steps):
            start = time.process_time()
            runner.forward(step, cache).argmax(-1).tolist()
            per_step[i] += time.process_time() - start
        start = time.process_time()
        for step in steps:
            padded.forward(step, cache).argmax(-1).tolist()
        padded_total.append(time.process_time() - start)
    total = sum(per_step)
    return {"steps": len(steps), "last_admission_step": last_admission,
            "drain_tail": sum(per_step[last_admission + 1:]) / total,
            "ragged_saving": 1 - (total / repeats) / statistics.median(padded_total)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per contender; the median is reported")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--median", type=float, default=16.0, help="median output length (lognormal, sigma 1)")
    parser.add_argument("--context", type=int, default=TinyModelConfig().max_positions,
                        help="the tiny model's max_position_embeddings (prompt + response)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    parser.add_argument("--out", default="bench-results")
    args = parser.parse_args(argv)
    if args.device not in ("cpu", "cuda"):
        print(f"error: --device {args.device!r}; use cpu or cuda", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA device; run on a GPU machine or use --device cpu",
              file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    clock = "cpu"
    if args.device == "cuda":
        Timer.sync = staticmethod(torch.cuda.synchronize)
        clock = "wall"  # host CPU seconds say little about GPU work

    model_cfg = TinyModelConfig(max_positions=args.context)
    model = build_tiny(model_cfg, VOCAB, seed=args.seed).eval().to(args.device)
    context = model_cfg.max_positions
    requests = workload(args.requests, context, args.seed, args.median)
    lengths = sorted(r.max_new_tokens for r in requests)
    median = statistics.median(lengths)
    p99 = lengths[min(len(lengths) - 1, math.ceil(0.99 * len(lengths)) - 1)]
    tokens = sum(lengths)
    print(f"workload: {len(requests)} requests, {tokens} output tokens, length median {median}, "
          f"p99 {p99} (p99/median {p99 / median:.1f}), max {lengths[-1]}; batch {args.batch}; "
          f"threads {args.threads}", file=sys.stderr)

    schedule: list[StepInputs] = []
    run_engine(model, requests, args.batch, record=schedule)  # also the engine's warm-up
    run_engine(model, requests, args.batch, bitwise=True)  # warm-up
    contenders = {
        "engine-fast": lambda: run_engine(model, requests, args.batch),
        "engine-bitwise": lambda: run_engine(model, requests, args.batch, bitwise=True),
        "bare-replay": lambda: run_replay(model, schedule, args.batch, context, tokens),
        "bare-loop": lambda: run_bare(model, requests, args.batch, context, ideal=False),
        "bare-ideal": lambda: run_bare(model, requests, args.batch, context, ideal=True),
        "hf-generate": lambda: run_hf(model, requests, args.batch),
    }
    for name in ("bare-loop", "bare-ideal", "bare-replay"):
        contenders[name]()  # warm-up (HF is slow enough to need none)
    runs: dict[str, list[tuple[Timer, int]]] = {name: [] for name in contenders}
    for round_ in range(args.repeats):
        order = list(contenders) if round_ % 2 == 0 else list(contenders)[::-1]  # drift hits both ends alike
        for name in order:
            fn = contenders[name]
            runs[name].append(fn())
            print(f"  round {round_ + 1}/{args.repeats} {name}: {runs[name][-1][0].cpu:.2f} s CPU, "
                  f"{runs[name][-1][0].wall:.2f} s wall", file=sys.stderr)
    results = {}
    for name, rs in runs.items():
        cpu = statistics.median(t.cpu for t, _ in rs)
        wall = statistics.median(t.wall for t, _ in rs)
        counted = rs[0][1]
        results[name] = {"cpu_seconds": cpu, "wall_seconds": wall, "cpu_runs": [t.cpu for t, _ in rs],
                         "wall_runs": [t.wall for t, _ in rs], "tokens_counted": counted,
                         "tokens_per_second": counted / cpu, "tokens_per_wall_second": counted / wall}

    # "X is": the median over rounds of that round's X vs contender tokens/s, so a slow patch of
    # the shared machine hits both sides of each ratio
    def round_ratios(engine: str, name: str, clock: str) -> list[float]:
        return [(engine_tokens / getattr(te, clock)) / (counted / getattr(tc, clock))
                for (te, engine_tokens), (tc, counted) in zip(runs[engine], runs[name])]

    def key(engine: str, name: str) -> str:
        return f"{engine.replace('-', '_')}_vs_{name.replace('-', '_')}"

    ratios, wall_ratios, cpu_rounds = {}, {}, {}
    for engine in ("engine-fast", "engine-bitwise"):
        for name in results:
            if name != engine and not (engine == "engine-bitwise" and name == "engine-fast"):
                ratios[key(engine, name)] = statistics.median(round_ratios(engine, name, clock))
                wall_ratios[key(engine, name)] = statistics.median(round_ratios(engine, name, "wall"))
                cpu_rounds[key(engine, name)] = round_ratios(engine, name, clock)
    # the cost of bit-exactness: bitwise time / fast time at equal slots, per round
    cost_rounds = [1 / r for r in round_ratios("engine-bitwise", "engine-fast", clock)]
    bitwise_cost = statistics.median(cost_rounds)
    unit = "CPU s" if clock == "cpu" else "wall s"
    print(f"\n{'contender':<15}{'tokens':>8}{unit:>8}{'tokens/s':>10}{'fast is':>10}{'bitwise is':>12}")
    for name, r in results.items():
        secs = r["cpu_seconds"] if clock == "cpu" else r["wall_seconds"]
        fast = "1.00x" if name == "engine-fast" else f"{ratios[key('engine-fast', name)]:.2f}x"
        bitwise = ("1.00x" if name == "engine-bitwise" else "" if name == "engine-fast"
                   else f"{ratios[key('engine-bitwise', name)]:.2f}x")
        print(f"{name:<15}{r['tokens_counted']:>8}{secs:>8.2f}{r['tokens_counted'] / secs:>10.0f}{fast:>10}"
              f"{bitwise:>12}")
    occupancy = tokens / (len(schedule) * args.batch)
    print(f"\nbitwise/fast {unit}: {bitwise_cost:.3f}x (target <= 1.15; rounds "
          f"{' '.join(f'{c:.3f}' for c in cost_rounds)})")
    print(f"vs hf-generate: fast {ratios['engine_fast_vs_hf_generate']:.2f}x, bitwise "
          f"{ratios['engine_bitwise_vs_hf_generate']:.2f}x (target >= 3); fast vs bare-replay "
          f"{ratios['engine_fast_vs_bare_replay']:.2f}x (scheduling overhead; target >= 0.85); fast vs bare-loop "
          f"{ratios['engine_fast_vs_bare_loop']:.2f}x, bare-ideal {ratios['engine_fast_vs_bare_ideal']:.2f}x (raw "
          f"forward rates); tokens/s on {unit}, medians of per-round ratios")
    print(f"engine batch occupancy {occupancy:.1%}: {tokens} tokens in {len(schedule)} steps of {args.batch} "
          f"slots; no schedule of this workload beats that share of bare-loop's rate at equal step cost")

    parts = breakdown(model, schedule, args.batch, context, args.repeats)
    parts["full_batch_steps"] = math.ceil(tokens / args.batch)
    print(f"engine schedule: {parts['steps']} steps ({parts['full_batch_steps']} at a full batch); "
          f"drain tail {parts['drain_tail']:.0%} of its forward time; ragged decode attention saves "
          f"{parts['ragged_saving']:.0%} of it over attending the longest live context")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    record = {
        "command": "benchmarks/engine.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "args": vars(args),
        "workload": {"requests": len(requests), "output_tokens": tokens, "median": median, "p99": p99,
                     "p99_over_median": p99 / median, "max": lengths[-1]},
        "model": {"arch": model_cfg.arch, "hidden": model_cfg.hidden_size, "layers": model_cfg.num_layers,
                  "max_positions": model_cfg.max_positions},
        "torch": torch.__version__,
        "device": args.device,
        "clock": clock,  # what the ratios divide: CPU seconds, or wall seconds on CUDA
        "results": results,
        "bitwise_over_fast_time": bitwise_cost,  # median over rounds; target <= 1.15
        "bitwise_over_fast_time_rounds": cost_rounds,
        "ratios": ratios,  # medians of per-round tokens/s ratios
        "ratios_rounds": cpu_rounds,
        "ratios_wall": wall_ratios,
        "engine_steps": len(schedule),  # the fast engine's; the bitwise one runs the same schedule
        "engine_batch_occupancy": occupancy,
        "breakdown": parts,
    }
    path = out / f"engine-{stamp}.json"
    path.write_text(json.dumps(record, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
