"""Owners of the optimizer state (cluster.shard=optimizer): who owns what, the all-gather of the
updated parameters, and the check that an owner steps with exactly its own state."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from poise.config import AlgorithmConfig, TinyModelConfig
from poise.model.loading import build_tiny
from poise.runtime.communicators import CommunicatorCache
from poise.runtime.train_shard import TorchTrainShard
from poise.training.state.placement import element_bounds, gather_runs, owner_runs
from poise.training.trainer import PolicyTrainer

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


def _shard(sharded: bool = True, rank: int = 0, mode: str | None = None) -> TorchTrainShard:
    model = build_tiny(TinyModelConfig(hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                                       intermediate_size=32, max_positions=32), 20, seed=0)
    trainer = PolicyTrainer(model, AlgorithmConfig(), pad_id=0)
    return TorchTrainShard(rank, trainer, CommunicatorCache(), True, torch.device("cpu"), lambda v: None,
                           mode or ("optimizer" if sharded else "none"))


def _moments(shard: TorchTrainShard, owned) -> None:
    """Distinct AdamW state for the parameters `owned(i)` says this process holds."""
    for i, p in enumerate(shard.trainer.params):
        if owned(i):
            shard.trainer.optimizer.state[p] = {"exp_avg": torch.full(p.shape, i + 0.5),
                                                "exp_avg_sq": torch.full(p.shape, i + 0.25), "step": torch.tensor(3.0)}


def _full_save_rank(rank: int, world: int, port: int, run_dir: str, queue) -> None:
    """One train device of `shard: full`: save a checkpoint (rank 0 writes, every owner streams its
    weights and state to it), watching the parameter bytes the writer holds as each tensor is
    written; then load it back, each device reading its own run, and digest the whole model."""
    import poise.training.checkpoint as ckpt
    from poise.training import tensor_files

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    ranks = list(range(world))
    shard = _shard(rank=rank, mode="full")
    digest = shard.digest()
    shard.state.shards.shard_over(ranks)
    _moments(shard, shard.state.shards.owns)
    held, real = [], ckpt.write_tensors

    def watched(path, entries):
        def watch(name, dtype, shape, value):
            def value_now():
                held.append(sum(p.untyped_storage().nbytes() for p in shard.trainer.params))
                return value()
            return name, dtype, shape, value_now
        return real(path, [watch(*e) for e in entries])

    ckpt.write_tensors = watched
    if rank == 0:
        shard.save_checkpoint(run_dir, 1, 1, None, ranks)
        shard.save_checkpoint(run_dir, 2, 1, None, ranks, parallel=True)  # each owner writes its part in place
    else:
        shard.send_optimizer_state(0, ranks)
        shard.send_optimizer_state(0, ranks, parallel=True)
    own = sum(p.untyped_storage().nbytes() for p in shard.trainer.params)
    if rank == world - 1:  # a full disk as the last owner writes its part of step 3: the writer says so
        def full_disk(path, entries, names):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        tensor_files.write_tensor_parts = full_disk
    failed = None
    if rank == 0:
        try:
            shard.save_checkpoint(run_dir, 3, 1, None, ranks, parallel=True)
        except ckpt.CheckpointSaveError as e:
            failed = str(e)
    else:
        shard.send_optimizer_state(0, ranks, parallel=True)
    dist.barrier()
    for p in shard.trainer.params:  # the load must fill every owned byte from the file
        if p.untyped_storage().nbytes():
            p.data.fill_(float("nan"))
    shard.load_checkpoint(str(Path(run_dir) / "checkpoints" / "step_000001"), ranks)
    loaded = sum(p.untyped_storage().nbytes() for p in shard.trainer.params)
    queue.put((rank, digest, shard.digest(), held, own, loaded, len(shard.trainer.optimizer.state), failed))
    dist.destroy_process_group()


def test_full_shard_checkpoints_stream_from_every_owner_and_load_back_by_run(tmp_path):
    """`shard: full`: streamed, the writer never holds more than its own run of the weights while
    it writes (each other owner's tensor arrives as it is due); in place, every owner writes its
    own tensors into the writer's files. Either way the files have the bytes the whole model's
    save writes, and a load reads each device's run alone and gives back the same weights. A full
    disk as one owner writes its part is the writer's one-line error, and the checkpoints before
    it stay."""
    from poise.training.checkpoint import TrainState, save_checkpoint

    world = 3
    whole = _shard(mode="none")
    _moments(whole, lambda i: True)
    reference = save_checkpoint(tmp_path / "whole", whole.trainer.model, whole.trainer.optimizer, TrainState(1, 1))
    total = sum(p.numel() * p.element_size() for p in whole.trainer.params)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    run_dir = tmp_path / "full"
    procs = [ctx.Process(target=_full_save_rank, args=(r, world, port, str(run_dir), queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    for step in (1, 2):  # streamed to the writer, then written in place by every owner
        got = run_dir / "checkpoints" / f"step_{step:06d}"
        for name in ("model.safetensors", "optimizer.safetensors"):
            assert (got / name).read_bytes() == (reference / name).read_bytes(), (step, name)
    writer = results[0]
    assert writer[3] and max(writer[3]) == writer[4] < total, (writer[3], writer[4], total)  # its run, never more
    assert sum(r[4] for r in results) == total and all(0 < r[4] < total for r in results), results
    assert [r[5] for r in results] == [r[4] for r in results]  # each loaded its own run, nothing else
    assert sum(r[6] for r in results) == len(whole.trainer.params)  # and the state of its run
    assert results[0][7] == f"disk full while saving step 3; step 2 is intact; free space and --resume {run_dir}"
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_000001", "step_000002"]
    digests = {r[1] for r in results} | {results[0][2]}
    assert len(digests) == 1 and results[1][2] is None, results


def test_an_owner_refuses_to_step_without_the_state_of_its_run():
    """AdamW would start a missing moment from zero without a word: a reshard that did not happen
    must stop the update instead."""
    shard = _shard()
    n = len(shard.trainer.params)
    shard.state.owned.check(0, n // 2)  # before any update: no state anywhere, fine
    shard.state.owned.stepped = True  # an update happened: the run's state must be here, all of it
    with pytest.raises(RuntimeError, match="a reshard of the optimizer state is missing"):
        shard.state.owned.check(0, n // 2)
    for p in shard.trainer.params[: n // 2]:
        shard.trainer.optimizer.state[p] = shard.trainer.fresh_state(p)
    shard.state.owned.check(0, n // 2)
    shard.trainer.optimizer.state[shard.trainer.params[-1]] = shard.trainer.fresh_state(shard.trainer.params[-1])
    with pytest.raises(RuntimeError, match=f"holds the optimizer state of parameters 0-{n // 2 - 1}, {n - 1}"):
        shard.state.owned.check(0, n // 2)  # another owner's state too: a reshard that did not hand it on
