"""A train device's memory and reduction traffic as micro-batches and train devices grow.

    .venv/bin/python benchmarks/train_memory.py [--shape 27m|100m] [--micro 4,16,64] [--world 2,3,4]

Part 1, memory (one process per cell, 1 torch thread, peak RSS from getrusage: measured, not
estimated): a random model of the built-in family computes the gradient of M micro-batches of
`--samples` sequences (`PolicyTrainer.micro_batch_grad`, as a train device does) and sums them in
the fixed tree order, two ways side by side:
  keep-all   every micro-batch's flat gradient kept until the reduction (the trainer before the
             streaming tree);
  streaming  each folded into the tree as it is computed (`TreeAccumulator`, what the trainer does
             in `determinism: bitwise`);
  running    one running sum (what a train device does in `determinism: semantic`, where the
             order of additions may change; not bit-compared, `--modes` names it to run it).
`floor` is a process that runs one micro-batch's forward/backward and nothing else.

Part 2, traffic (`--world` gloo processes on this machine, a flat gradient of the model's size):
each rank holds the tree nodes of its contiguous range of `--traffic-micro` micro-batches (the step
plan's `contiguous_ranges`) and runs the trainer's exchange (`exchange_and_combine`). Received bytes
per rank per update are counted and set against the model's gradient bytes, beside what the
all-gather of every rank's nodes that it replaced received (W x most nodes x model). The combined
gradient is checked bit for bit against one process's tree sum of all micro-batches.

Writes bench-results/train_memory-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from results import write_results  # benchmarks/results.py

SHAPES = {  # the built-in family (Qwen2), char vocabulary
    "27m": dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=1536),
    "100m": dict(hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4, intermediate_size=3072),
}
MB = 2**20


def shape_dims(shape: str) -> dict:
    """A named shape, or `<hidden>x<layers>` (64-wide heads, 4 KV heads, MLP 4 x hidden)."""
    if shape in SHAPES:
        return SHAPES[shape]
    hidden, layers = (int(x) for x in shape.split("x"))
    return dict(hidden_size=hidden, num_layers=layers, num_heads=hidden // 64, num_kv_heads=4,
                intermediate_size=4 * hidden)


def _model(shape: str):
    from poise.config import TinyModelConfig
    from poise.data.tokenizer import CharTokenizer
    from poise.model.loading import build_tiny

    tok = CharTokenizer()
    return build_tiny(TinyModelConfig(max_positions=256, **shape_dims(shape)), tok.vocab_size, 0), tok


def memory_cell(shape: str, mode: str, micro: int, samples: int, tokens: int) -> dict:
    """Runs in a child process: one cell of part 1."""
    import torch

    from poise.config import AlgorithmConfig
    from poise.training.reduce import TreeAccumulator, combine
    from poise.training.trainer import PolicyTrainer
    from poise.types import Sample

    torch.set_num_threads(1)
    model, tok = _model(shape)
    trainer = PolicyTrainer(model, AlgorithmConfig(), tok.pad_id)
    numel = sum(p.numel() for p in trainer.params)
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    kept: list = []
    tree = TreeAccumulator(torch.add)
    for i in range(1 if mode == "floor" else micro):
        batch = [Sample((0, i, j), tuple(torch.randint(4, tok.vocab_size, (16,), generator=gen).tolist()),
                        tuple(torch.randint(4, tok.vocab_size, (tokens,), generator=gen).tolist()),
                        tuple([-2.0] * tokens), "stop", 0, 0.0, 0.0, tokens) for j in range(samples)]
        adv = torch.linspace(-1, 1, samples)
        result = trainer.micro_batch_grad(i, batch, adv)
        flat, result.flat_grad = result.flat_grad, torch.empty(0)
        if mode == "keep-all":
            kept.append(flat)
        elif mode == "streaming":
            tree.push(i, flat, micro)
        elif mode == "running":
            running = flat if i == 0 else running.add_(flat)
        del flat, result
    if mode == "keep-all":
        total = combine({(0, i): g for i, g in enumerate(kept)}, micro, torch.add)
    elif mode == "streaming":
        total = combine(tree.nodes(micro), micro, torch.add)
    elif mode == "running":
        total = running
    else:
        total = None
    digest = None if total is None else __import__("hashlib").sha256(total.numpy().tobytes()).hexdigest()[:16]
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"shape": shape, "mode": mode, "micro": micro, "params": numel, "peak_rss_mb": peak_kb / 1024,
            "seconds": time.perf_counter() - t0, "sum_digest": digest, "held_peak": tree.peak}


def traffic_rank(rank: int, world: int, port: int, numel: int, micro: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from poise.policy.plan import contiguous_ranges
    from poise.runtime.transport import Direct
    from poise.training.state.exchange import exchange_and_combine
    from poise.training.reduce import TreeAccumulator, index_nodes, tree_sum

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)

    def leaf(i: int) -> torch.Tensor:
        return torch.randn(numel, generator=torch.Generator().manual_seed(i)) * 10.0 ** (i % 5)

    lo, hi = contiguous_ranges(micro, world)[rank]
    tree = TreeAccumulator(torch.add)
    for i in range(lo, hi):
        tree.push(i, leaf(i), micro)
    nodes = tree.nodes(micro)
    most = torch.tensor([float(len(nodes))])
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    t0 = time.perf_counter()
    total, received = exchange_and_combine(nodes, micro, list(range(world)), rank, dist.group.WORLD, numel,
                                           torch.device("cpu"), int(most.item()), transport=Direct())
    seconds = time.perf_counter() - t0
    exact = None
    if rank == 0:
        exact = bool(torch.equal(total, tree_sum([leaf(i) for i in range(micro)], torch.add)))
    queue.put({"rank": rank, "nodes": len(nodes), "most_nodes": int(most.item()), "received_bytes": received,
               "seconds": seconds, "exact": exact, "all_nodes": index_nodes(range(lo, hi), micro)})
    dist.destroy_process_group()


def traffic(world: int, numel: int, micro: int) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = 29600 + world
    procs = [ctx.Process(target=traffic_rank, args=(r, world, port, numel, micro, queue)) for r in range(world)]
    for p in procs:
        p.start()
    rows = sorted((queue.get(timeout=600) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join()
    grad_bytes = 4 * numel
    most = rows[0]["most_nodes"]
    return {"world": world, "micro": micro, "grad_bytes": grad_bytes,
            "received_max_x_grad": max(r["received_bytes"] for r in rows) / grad_bytes,
            "allgather_x_grad": world * most * (numel + 2) * 4 / grad_bytes,
            "nodes": [r["nodes"] for r in rows], "seconds_max": max(r["seconds"] for r in rows),
            "exact": rows[0]["exact"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="27m", choices=sorted(SHAPES))
    ap.add_argument("--micro", default="4,16,64", help="micro-batches per device, comma-separated")
    ap.add_argument("--samples", type=int, default=2, help="sequences per micro-batch")
    ap.add_argument("--tokens", type=int, default=32, help="response tokens per sequence (after 16 prompt tokens)")
    ap.add_argument("--modes", default="floor,streaming,keep-all")
    ap.add_argument("--world", default="2,3,4", help="train devices of the traffic part; empty skips it")
    ap.add_argument("--traffic-micro", type=int, default=8)
    ap.add_argument("--cell", help=argparse.SUPPRESS)  # internal: run one memory cell and print its JSON
    args = ap.parse_args()
    if args.cell:
        shape, mode, micro = args.cell.split(":")
        print(json.dumps(memory_cell(shape, mode, int(micro), args.samples, args.tokens)))
        return

    cells = []
    micros = [int(m) for m in args.micro.split(",")]
    for mode in args.modes.split(","):
        for micro in ([1] if mode == "floor" else micros):
            out = subprocess.run([sys.executable, __file__, "--cell", f"{args.shape}:{mode}:{micro}",
                                  "--samples", str(args.samples), "--tokens", str(args.tokens)],
                                 capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
            if out.returncode != 0:
                sys.exit(f"cell {mode} x {micro} failed:\n{out.stderr[-2000:]}")
            cells.append(json.loads(out.stdout.strip().splitlines()[-1]))
            c = cells[-1]
            print(f"  {c['mode']:<10} M={c['micro']:<3} peak RSS {c['peak_rss_mb']:7.0f} MB  "
                  f"({c['seconds']:.0f} s, sum {c['sum_digest']})", flush=True)
    params = cells[0]["params"]
    print(f"\nmemory: {args.shape} ({params / 1e6:.1f}M parameters, fp32 gradient {4 * params / MB:.0f} MB), "
          f"{args.samples} x (16 + {args.tokens}) tokens per micro-batch, 1 thread")
    print(f"{'mode':<10} {'M':>4} {'peak RSS MB':>12} {'vs M=' + str(micros[0]):>9}")
    for c in cells:
        base = next((b for b in cells if b["mode"] == c["mode"] and b["micro"] == micros[0]), c)
        print(f"{c['mode']:<10} {c['micro']:>4} {c['peak_rss_mb']:>12.0f} {c['peak_rss_mb'] / base['peak_rss_mb']:>9.3f}")
    for m in micros:  # the two reductions must agree bit for bit
        digests = {c["sum_digest"] for c in cells if c["micro"] == m and c["mode"] in ("streaming", "keep-all")}
        if len(digests) > 1:
            sys.exit(f"M={m}: the keep-all and streaming sums differ: {digests}")

    rows = []
    worlds = [int(w) for w in args.world.split(",") if w]
    for w in worlds:
        rows.append(traffic(w, params, args.traffic_micro))
    if rows:
        print(f"\ntraffic: a {params / 1e6:.1f}M-parameter gradient, {args.traffic_micro} micro-batches, "
              "bytes received per rank per update (x the model's gradient bytes)")
        print(f"{'W':>3} {'nodes per rank':>15} {'exchange':>9} {'all-gather':>11} {'exact':>6} {'s':>6}")
        for r in rows:
            print(f"{r['world']:>3} {str(r['nodes']):>15} {r['received_max_x_grad']:>9.2f} {r['allgather_x_grad']:>11.2f}"
                  f" {str(r['exact']):>6} {r['seconds_max']:>6.2f}")
        if not all(r["exact"] for r in rows):
            sys.exit("the exchange's sum differs from one process's tree sum")
    write_results("train_memory", {"args": vars(args), "memory": cells, "traffic": rows})


if __name__ == "__main__":
    main()
