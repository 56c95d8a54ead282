"""Owners of the optimizer state (cluster.shard=optimizer): who owns what, the all-gather of the
updated parameters, and the check that an owner steps with exactly its own state."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from poise.config import AlgorithmConfig, TinyModelConfig
from poise.model.loading import build_tiny
from poise.runtime.train_shard import CommunicatorCache, TorchTrainShard, gather_runs
from poise.train.sharding import element_bounds, owner_runs
from poise.train.trainer import PolicyTrainer

SIZES = [[5, 1, 1, 1, 1, 1], [1] * 7, [10], [3, 3, 3, 3], [100, 7, 7, 300, 2, 2, 50]]


@pytest.mark.parametrize("sizes", SIZES, ids=str)
@pytest.mark.parametrize("parties", [1, 2, 3, 4, 8])
def test_owners_hold_contiguous_runs_of_whole_parameters_that_cover_each_once(sizes, parties):
    runs = owner_runs(sizes, parties)
    assert len(runs) == parties
    assert runs[0][0] == 0 and runs[-1][1] == len(sizes)
    assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))  # contiguous, in order, no gap, no overlap
    bounds = element_bounds(sizes, runs)
    assert bounds[0][0] == 0 and bounds[-1][1] == sum(sizes)
    assert [b - a for a, b in bounds] == [sum(sizes[a:b]) for a, b in runs]
    # each run ends at the first boundary at or past its share: no owner is short of it by a whole tensor
    total = sum(sizes)
    for i, (lo, hi) in enumerate(bounds[:-1]):
        assert hi >= total * (i + 1) // parties or runs[i][1] == len(sizes)


def test_owners_of_a_model_split_its_state_about_evenly():
    sizes = [768 * 3000, *([768 * 768 * 4 + 768 * 3072 * 3 + 2 * 768] * 12), 768]
    for parties in (2, 3, 4):
        share = [b - a for a, b in element_bounds(sizes, owner_runs(sizes, parties))]
        assert max(share) <= sum(sizes) / parties + max(sizes), (parties, share)


def _gather_rank(rank: int, world: int, port: int, queue) -> None:
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    queue.put([(chunk, rank, *_gather_once(rank, world, chunk)) for chunk in (1, 3, 1000)])
    dist.destroy_process_group()


def _gather_once(rank: int, world: int, chunk: int) -> tuple[bool, int]:
    shapes = [(3, 4), (5,), (2, 2, 2), (7,), (1,)]
    truth = [torch.arange(torch.Size(s).numel(), dtype=torch.float32).view(s) + 100 * i for i, s in enumerate(shapes)]
    sizes = [t.numel() for t in truth]
    bounds = element_bounds(sizes, owner_runs(sizes, world))
    lo, hi = bounds[rank]
    params = [torch.full(s, -1.0) for s in shapes]  # only this rank's run holds the truth
    flat = torch.cat([t.reshape(-1) for t in truth])
    offset = 0
    for p in params:
        n = p.numel()
        a, b = max(lo, offset), min(hi, offset + n)
        if a < b:
            p.view(-1)[a - offset:b - offset] = flat[a:b]
        offset += n
    received = gather_runs(params, bounds, rank, dist.group.WORLD, chunk=chunk)
    return all(torch.equal(p, t) for p, t in zip(params, truth)), received


def test_the_updated_runs_return_to_every_owner_in_bounded_chunks():
    """Chunks of 1 and 3 elements cross every tensor and owner boundary; 1000 is one all-gather."""
    world = 3
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_gather_rank, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = sorted(row for _ in procs for row in queue.get(timeout=300))
    for p in procs:
        p.join(timeout=60)
    assert [ok for _, _, ok, _ in results] == [True] * 3 * world, results
    for chunk in (1, 3, 1000):  # every rank receives the same: W pieces of the longest run
        assert len({received for c, _, _, received in results if c == chunk}) == 1


def _shard(sharded: bool = True) -> TorchTrainShard:
    model = build_tiny(TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                                       intermediate_size=32, max_positions=32), 20, seed=0)
    trainer = PolicyTrainer(model, AlgorithmConfig(), pad_id=0)
    return TorchTrainShard(0, trainer, CommunicatorCache(), True, torch.device("cpu"), lambda v: None,
                           "optimizer" if sharded else "none")


def test_an_owner_refuses_to_step_without_the_state_of_its_run():
    """AdamW would start a missing moment from zero without a word: a reshard that did not happen
    must stop the update instead."""
    shard = _shard()
    n = len(shard.trainer.params)
    shard._check_state(0, n // 2)  # before any update: no state anywhere, fine
    shard.stepped = True  # an update happened: the run's state must be here, all of it
    with pytest.raises(RuntimeError, match="a reshard of the optimizer state is missing"):
        shard._check_state(0, n // 2)
    for p in shard.trainer.params[: n // 2]:
        shard.trainer.optimizer.state[p] = shard.trainer.fresh_state(p)
    shard._check_state(0, n // 2)
    shard.trainer.optimizer.state[shard.trainer.params[-1]] = shard.trainer.fresh_state(shard.trainer.params[-1])
    with pytest.raises(RuntimeError, match=f"holds the optimizer state of parameters 0-{n // 2 - 1}, {n - 1}"):
        shard._check_state(0, n // 2)  # another owner's state too: a reshard that did not hand it on
