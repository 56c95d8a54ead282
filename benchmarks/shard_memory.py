"""What `cluster.shard: optimizer | full` saves on each train device: state bytes and peak memory.

    .venv/bin/python benchmarks/shard_memory.py [--shape 100m] [--world 4] [--micro 2] [--updates 2]
        [--modes none,optimizer,full]

`--world` gloo processes on this machine, each a train device as the runtime builds it
(`PolicyTrainer` + `TorchTrainShard`, bitwise mode, 1 torch thread): each computes its `--micro`
micro-batches of a random model of the built-in family (the same samples in every mode), then the
update (the exchange, the clip, AdamW, and with `optimizer` the all-gather of the parameters), for
`--updates` updates; with `full` the micro-batches run as lockstep rounds (`train_round`: each
module's parameters gathered from their owner, each gradient sent to its owner). Per mode,
measured in each process: the AdamW state and the weights it holds after the last update (bytes
of their tensors), its peak RSS (getrusage) and the bytes it received per update (with `full`,
the part that is gathered weights, beside the gradient exchange). `floor` is one process that runs one
micro-batch's forward/backward and nothing else (the memory no sharding of the state can remove).
The weights after the last update are checked bit for bit between the modes.

Writes bench-results/shard_memory-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import hashlib
import resource
import time

from results import write_results  # benchmarks/results.py
from train_memory import SHAPES, _model, memory_cell

MB = 2**20


def device(rank: int, world: int, port: int, shape: str, shard: str, micro: int, updates: int, samples: int,
           tokens: int, queue, model_dir: str | None = None) -> None:
    """One train device. `model_dir`: the shape saved as an HF directory, loaded as `poise train
    model.path=DIR` loads it (with `full`, this device's own run of it alone: runtime/worker.py);
    default: the seeded built-in model, built whole."""
    import torch
    import torch.distributed as dist

    from poise.config import AlgorithmConfig
    from poise.policy.plan import contiguous_ranges
    from poise.runtime.communicators import CommunicatorCache
    from poise.runtime.train_shard import TorchTrainShard
    from poise.training.reduce import index_nodes
    from poise.training.trainer import PolicyTrainer
    from poise.types import Sample

    torch.set_num_threads(1)
    torch.manual_seed(0)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    owners = list(range(world)) if model_dir is not None and shard == "full" and world > 1 else None
    if model_dir is None:
        model, tok = _model(shape)
    else:
        from poise.data.tokenizer import CharTokenizer
        from poise.model.loading import load_model
        from poise.runtime.worker import _own_run

        tok = CharTokenizer()
        model = load_model(model_dir, keep=None if owners is None else _own_run(model_dir, torch.float32, owners, rank))
    trainer = PolicyTrainer(model, AlgorithmConfig(), tok.pad_id)
    rounds = shard == "full"  # micro-batches in lockstep rounds, as the trainer group sends them
    shard = TorchTrainShard(rank, trainer, CommunicatorCache(), True, torch.device("cpu"), lambda v: None, shard)
    if owners is not None:
        shard.adopt(owners)
    m = micro * world
    ranges = contiguous_ranges(m, world)
    rows = max(len(index_nodes(range(a, b), m)) for a, b in ranges)
    lo, hi = ranges[rank]
    t0 = time.perf_counter()
    out = {}
    for u in range(updates):
        gen = torch.Generator().manual_seed(u)
        batches = [[Sample((u, i, j), tuple(torch.randint(4, tok.vocab_size, (16,), generator=gen).tolist()),
                           tuple(torch.randint(4, tok.vocab_size, (tokens,), generator=gen).tolist()),
                           tuple([-2.0] * tokens), "stop", 0, 0.0, 0.0, tokens) for j in range(samples)]
                   for i in range(m)]  # every rank draws every micro-batch: the same samples in any split
        # full: every W-th micro-batch from its rank, in rounds (runtime/trainer_group.py); else the plan's range
        mine = range(rank, m, world) if rounds else range(lo, hi)
        for i in mine:
            advantages = list(torch.linspace(-1, 1, samples).tolist())
            if rounds:  # every device has `micro` of them: no stand-in round
                shard.train_round(i, batches[i], advantages, list(range(world)))
            else:
                shard.train_micro_batch(i, batches[i], advantages)
        out = shard.apply_update(m, list(mine), float(m * samples * tokens), list(range(world)), rows)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the digest gathers the weights
    digest = shard.digest()  # full: collective, rank 0 answers
    queue.put({"rank": rank, "optimizer_bytes": out["optimizer_bytes"], "received_bytes": out.get("received_bytes"),
               "parameter_bytes": out["parameter_bytes"], "grad_bytes": out.get("grad_bytes"),
               "weight_bytes": out.get("weight_bytes", 0),
               "peak_rss_mb": peak, "seconds": time.perf_counter() - t0,
               "digest": digest and digest[:16], "params": trainer.numel})
    dist.destroy_process_group()


def run(world: int, shard: str, args, port: int) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=device, args=(r, world, port, args.shape, shard, args.micro, args.updates,
                                              args.samples, args.tokens, queue)) for r in range(world)]
    for p in procs:
        p.start()
    rows = sorted((queue.get(timeout=1800) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join()
    return {"shard": shard, "world": world, "devices": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="100m", choices=sorted(SHAPES))
    ap.add_argument("--world", type=int, default=4, help="train devices (processes)")
    ap.add_argument("--micro", type=int, default=2, help="micro-batches per device per update")
    ap.add_argument("--updates", type=int, default=2)
    ap.add_argument("--samples", type=int, default=2, help="sequences per micro-batch")
    ap.add_argument("--tokens", type=int, default=32, help="response tokens per sequence (after 16 prompt tokens)")
    ap.add_argument("--modes", default="none,optimizer,full", help="shard modes, the first is the baseline")
    args = ap.parse_args()
    modes = args.modes.split(",")

    import multiprocessing as mp

    with mp.get_context("spawn").Pool(1) as pool:  # its own process: its peak is its own
        floor = pool.apply(memory_cell, (args.shape, "floor", 1, args.samples, args.tokens))
    runs = [run(args.world, shard, args, 29700 + i) for i, shard in enumerate(modes)]
    params = runs[0]["devices"][0]["params"]
    print(f"\n{args.shape} ({params / 1e6:.1f}M parameters; fp32 weights {4 * params / MB:.0f} MB, AdamW state "
          f"{8 * params / MB:.0f} MB), {args.world} train devices, {args.micro} micro-batches of {args.samples} x "
          f"(16 + {args.tokens}) tokens each per update, {args.updates} updates, 1 thread per device")
    print(f"floor (one micro-batch's forward/backward alone): peak RSS {floor['peak_rss_mb']:.0f} MB")
    print(f"{'shard':<10} {'AdamW MB per device':>28} {'weights MB per device':>28} {'peak RSS MB per device':>30} "
          f"{'max - floor':>12} {'received / gradient':>20} {'of which weights':>17}")
    for r in runs:
        state = [d["optimizer_bytes"] / MB for d in r["devices"]]
        weights = [d["parameter_bytes"] / MB for d in r["devices"]]
        peak = [d["peak_rss_mb"] for d in r["devices"]]
        r["state_max_mb"], r["peak_max_mb"], r["weights_max_mb"] = max(state), max(peak), max(weights)
        r["above_floor_mb"] = max(peak) - floor["peak_rss_mb"]
        r["received_per_gradient"] = max(d["received_bytes"] / d["grad_bytes"] for d in r["devices"])
        # full: the weights each round gathers (forward and backward), the rest is the gradient exchange
        r["weights_per_gradient"] = max(d["weight_bytes"] / d["grad_bytes"] for d in r["devices"])
        r["exchange_per_gradient"] = max((d["received_bytes"] - d["weight_bytes"]) / d["grad_bytes"]
                                         for d in r["devices"])
        print(f"{r['shard']:<10} {' '.join(f'{s:6.0f}' for s in state):>28} "
              f"{' '.join(f'{w:6.0f}' for w in weights):>28} {' '.join(f'{p:6.0f}' for p in peak):>30}"
              f" {r['above_floor_mb']:>12.0f} {r['received_per_gradient']:>19.2f}x"
              f" {r['weights_per_gradient']:>16.2f}x")
    none = runs[0]
    ratios = {}
    for sharded in runs[1:]:
        ratios[sharded["shard"]] = {"state_max": sharded["state_max_mb"] / none["state_max_mb"],
                                    "peak_max": sharded["peak_max_mb"] / none["peak_max_mb"],
                                    "above_floor": sharded["above_floor_mb"] / none["above_floor_mb"]}
        r = ratios[sharded["shard"]]
        print(f"{sharded['shard']} / {none['shard']}: most AdamW state on a device {r['state_max']:.3f}, peak RSS "
              f"{r['peak_max']:.3f}, peak above the floor {r['above_floor']:.3f}")
    digests = {d["digest"] for r in runs for d in r["devices"] if d["digest"] is not None}
    print(f"weights after the last update: {'identical' if len(digests) == 1 else 'DIFFER'} in every device and mode")
    write_results("shard_memory", {"args": vars(args), "floor": floor, "runs": runs, "ratios": ratios,
                                   "identical": len(digests) == 1})
    if len(digests) != 1:
        raise SystemExit(f"the weights differ between modes or devices: {sorted(digests)}")


if __name__ == "__main__":
    main()
