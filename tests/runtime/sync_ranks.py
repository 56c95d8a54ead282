"""One rank of the two-rank gloo world of tests/runtime/test_weight_sync_ranks.py (a script, not a
test): pre-warm, a bucketed weight sync and an optimizer staging between two real processes, with
torch.distributed's calls and the device synchronisation counted.

    python sync_ranks.py RANK STORE_FILE OUT_JSON
"""

from __future__ import annotations

import hashlib
import json
import sys
import weakref

import torch
import torch.distributed as dist

from poise.config import AlgorithmConfig, EngineConfig, SamplingConfig, TinyModelConfig
from poise.model.loading import build_tiny
from poise.rollout.engine import Engine
from poise.runtime.communicators import CommunicatorCache
from poise.runtime.weight_sync import BroadcastSync
from poise.training.state import streams
from poise.training.state.digest import weights_digest
from poise.training.state.transfer import OptimizerTransfer
from poise.training.trainer import PolicyTrainer

BUCKET_FLOATS = 1000  # several buckets for the tiny model below


def main(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    shape = TinyModelConfig(hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=32,
                            max_positions=32)
    model = build_tiny(shape, 40, seed=rank)  # different weights on each rank: the sync must move them
    engine = Engine(model, EngineConfig(num_slots=2, max_context=32), SamplingConfig(max_new_tokens=4), 0, None)
    counts = {"all_reduce": 0, "sync": 0, "most_buffers_alive": 0, "broadcasts": 0}

    real_all_reduce, real_broadcast = dist.all_reduce, dist.broadcast
    received: list[weakref.ref] = []  # every tensor broadcast into, weakly: those still alive are held

    def all_reduce(*args, **kwargs):
        counts["all_reduce"] += 1
        return real_all_reduce(*args, **kwargs)

    def broadcast(tensor, *args, **kwargs):
        counts["most_buffers_alive"] = max(counts["most_buffers_alive"], sum(r() is not None for r in received))
        counts["broadcasts"] += 1
        received.append(weakref.ref(tensor))
        return real_broadcast(tensor, *args, **kwargs)

    def sync(device):
        counts["sync"] += 1

    dist.all_reduce, dist.broadcast = all_reduce, broadcast
    streams.synchronize = sync
    comm = CommunicatorCache()
    weights = BroadcastSync(rank, model, comm, torch.device("cpu"), lambda fn: fn(engine))
    cached = weights.prewarm([[0, 1], [0], [1]])
    warm = dict(counts, cached=cached, warmed=getattr(comm, "warmed", None))

    counts.update(sync=0, most_buffers_alive=0, broadcasts=0)
    received.clear()
    before = weights_digest(model)
    seconds = weights.publish(0, [0, 1], 7, BUCKET_FLOATS * 4 / 2**20)
    publish = dict(counts, seconds=seconds, version=engine.version, before=before, after=weights_digest(model))

    trainer = PolicyTrainer(model, AlgorithmConfig(), 0)
    if rank == 0:
        gen = torch.Generator().manual_seed(5)
        for p in trainer.params:
            trainer.optimizer.state[p] = {"step": torch.tensor(3.0), "exp_avg": torch.randn(p.shape, generator=gen),
                                          "exp_avg_sq": torch.rand(p.shape, generator=gen)}
    counts.update(sync=0)
    transfer = OptimizerTransfer(rank, 0, comm.get([0, 1]), trainer, 4096, torch.device("cpu"))
    transfer.run()
    h = hashlib.sha256()
    for p in trainer.params:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            h.update(trainer.optimizer.state[p][key].numpy().tobytes())
    stage = {"sync": counts["sync"], "state": h.hexdigest()}
    with open(out, "w") as f:
        json.dump({"warm": warm, "publish": publish, "stage": stage}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
