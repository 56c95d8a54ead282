"""Point-to-point transfers where devices share a GPU (runtime/transport.py).

gloo, the backend of shared-GPU mode, refuses CUDA tensors in send and recv. Every point-to-point
transfer of the train devices (the gradient exchange, the optimizer reshard, streamed checkpoints,
the gradient sink and the weight sync under `shard: full`) must go through the transport the
worker chose, which stages through host buffers exactly where gloo would get a CUDA tensor. With
no GPU here, the ranks below ask for the staging transport explicitly (the code path a CUDA
tensor takes) while send and recv refuse any tensor that is not a staging buffer, as gloo refuses
a CUDA tensor: the results must be those of the direct transport, bit for bit.
"""

from __future__ import annotations

import socket
import time
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from poise.config import AlgorithmConfig, EngineConfig, SamplingConfig, TinyModelConfig
from poise.model.loading import build_tiny
from poise.rollout.engine import Engine
from poise.runtime.communicators import CommunicatorCache
from poise.runtime.train_shard import TorchTrainShard
from poise.runtime.transport import Direct, HostStaged, transport_for
from poise.runtime.weight_sync import BroadcastSync
from poise.training.reduce import TreeAccumulator, combine
from poise.training.state import streams
from poise.training.state.digest import weights_digest
from poise.training.state.exchange import exchange_and_combine
from poise.training.state.placement import owner_runs
from poise.training.trainer import PolicyTrainer
from poise.types import Sample

WORLD = 3
SHAPE = TinyModelConfig(hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=32,
                        max_positions=32)


def test_the_transport_is_decided_by_backend_and_tensor_device():
    assert isinstance(transport_for("gloo", torch.device("cuda", 0)), HostStaged)  # shared GPU: staged
    assert isinstance(transport_for("nccl", torch.device("cuda", 0)), Direct)  # separate GPUs
    assert isinstance(transport_for("gloo", torch.device("cpu")), Direct)  # CPU devices


class GlooOfCudaTensors:
    """dist.send/recv/isend/irecv refuse every tensor that is not one of the staging transport's
    host buffers, as gloo refuses a CUDA tensor (while `on`)."""

    def __init__(self) -> None:
        self.on, self.refused, self.staged = False, [], {}
        real_buffer = HostStaged.host_buffer

        def host_buffer(transport, like):
            buffer = real_buffer(transport, like)
            self.staged[id(buffer)] = weakref.ref(buffer)
            return buffer

        HostStaged.host_buffer = host_buffer
        for name in ("send", "recv", "isend", "irecv"):
            setattr(dist, name, self._guarded(getattr(dist, name), name))

    def _guarded(self, real, name):
        def call(tensor, *args, **kwargs):
            ref = self.staged.get(id(tensor))
            if self.on and (ref is None or ref() is not tensor):
                self.refused.append(name)
                raise RuntimeError(f"gloo: {name} of a device tensor ({tuple(tensor.shape)}) that was not staged")
            return real(tensor, *args, **kwargs)
        return call


def _shard(rank: int, mode: str, transport, seed: int = 0) -> TorchTrainShard:
    model = build_tiny(SHAPE, 20, seed=seed)
    trainer = PolicyTrainer(model, AlgorithmConfig(), pad_id=0)
    return TorchTrainShard(rank, trainer, CommunicatorCache(transport=transport), True, torch.device("cpu"),
                           lambda v: None, mode)


def _leaf(index: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(index))


def _exchange(rank: int, transport) -> list[float]:
    """Micro-batches 0..6 over the 3 ranks (3, 2, 2): the root of the fixed tree, on every rank."""
    numel, m = 37, 7
    mine = {0: [0, 1, 2], 1: [3, 4], 2: [5, 6]}[rank]
    tree = TreeAccumulator(torch.add)
    for i in mine:
        tree.push(i, _leaf(i, numel))
    total, _ = exchange_and_combine(tree.nodes(m), m, list(range(WORLD)), rank, dist.group.WORLD, numel,
                                    torch.device("cpu"), 3, transport=transport)
    return total.tolist()


def _full_round(rank: int, transport) -> str | None:
    """`shard: full`: one lockstep round (each rank's micro-batch; gradients go to their owners
    point to point), the owners' step, and the digest of the updated model."""
    ranks = list(range(WORLD))
    shard = _shard(rank, "full", transport)
    shard.state.shards.shard_over(ranks)
    sample = Sample((0, 0, rank), (3, 4, 5), (6, 7, 8 + rank), (-1.0, -1.0, -1.0), "length", 0, 0.0, 0.0, 3)
    shard.train_round(rank, [sample], [1.0 + rank], ranks)
    shard.apply_update(WORLD, [rank], 3.0, ranks, 1)
    return shard.digest()


def _reshard(rank: int, transport) -> tuple[list[tuple[int, float, float, float]], int]:
    """`shard: optimizer`, 3 -> 2 train devices [1, 2]: the state of every parameter whose owner
    changes moves point to point; returns (parameter, step, exp_avg, exp_avg_sq) held here, and
    the number of parameters."""
    shard = _shard(rank, "optimizer", transport)
    first, end = owner_runs(shard.state.sizes, WORLD)[rank]
    for i, p in enumerate(shard.trainer.params):
        if first <= i < end:
            shard.trainer.optimizer.state[p] = {"step": torch.tensor(3.0 + i), "exp_avg": torch.full(p.shape, i + 0.5),
                                                "exp_avg_sq": torch.full(p.shape, i + 0.25)}
    shard.state.owned.stepped = True
    shard.reshard_optimizer(list(range(WORLD)), [1, 2], 64)  # 16 floats a chunk: many chunks per tensor
    shard.wait_optimizer_transfer()
    index = {id(p): i for i, p in enumerate(shard.trainer.params)}
    return sorted((index[id(p)], float(st["step"]), st["exp_avg"].view(-1)[0].item(),
                   st["exp_avg_sq"].view(-1)[-1].item()) for p, st in shard.trainer.optimizer.state.items()), \
        len(shard.trainer.params)


def _streamed_save(rank: int, transport, run_dir: str) -> None:
    """`shard: full`: a checkpoint streamed to rank 0 (the others send their weights and state)."""
    ranks = list(range(WORLD))
    shard = _shard(rank, "full", transport)
    shard.state.shards.shard_over(ranks)
    for i, p in enumerate(shard.trainer.params):
        if shard.state.shards.owns(i):
            shard.trainer.optimizer.state[p] = {"exp_avg": torch.full(p.shape, i + 0.5),
                                                "exp_avg_sq": torch.full(p.shape, i + 0.25), "step": torch.tensor(3.0)}
    if rank == 0:
        shard.save_checkpoint(run_dir, 1, 1, None, ranks)
    else:
        shard.send_optimizer_state(0, ranks)


def _owners_sync(rank: int, transport) -> str:
    """`shard: full`'s weight sync: train devices 1 and 2 send the parameters they own to rollout
    device 0, which starts with other weights; returns the digest each rank holds after it."""
    model = build_tiny(SHAPE, 20, seed=0 if rank else 7)
    engine = Engine(model, EngineConfig(num_slots=2, max_context=32), SamplingConfig(max_new_tokens=4), 0, None)
    sync = BroadcastSync(rank, model, CommunicatorCache(transport=transport), torch.device("cpu"),
                         lambda fn: fn(engine))
    sync.publish(1, list(range(WORLD)), 5, 0.0005, sources=[1, 2])
    return weights_digest(model)


def _rank(rank: int, port: int, run_dir: str, queue) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    gloo = GlooOfCudaTensors()
    out = {}
    for name, transport in (("direct", Direct()), ("staged", HostStaged())):
        gloo.on = name == "staged"
        try:
            out[name] = {"exchange": _exchange(rank, transport), "full": _full_round(rank, transport),
                         "reshard": _reshard(rank, transport), "sync": _owners_sync(rank, transport)}
            _streamed_save(rank, transport, f"{run_dir}/{name}")
            if name == "staged":
                out[name]["staged_bytes"] = transport.staged_bytes
        except Exception as e:  # noqa: BLE001 - reported by the test
            out[name] = f"{type(e).__name__}: {e}"
            break
    out["refused"] = gloo.refused
    queue.put((rank, out))
    dist.destroy_process_group()


def test_every_point_to_point_transfer_is_staged_where_gloo_carries_device_tensors(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, str(tmp_path), queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        results = dict(queue.get(timeout=240) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    for rank, out in results.items():
        assert out["refused"] == [], (rank, out["refused"], out.get("staged"))
        assert isinstance(out["staged"], dict), (rank, out["staged"])
        assert out["staged"]["staged_bytes"] > 0
        for what in ("exchange", "full", "reshard", "sync"):
            assert out["staged"][what] == out["direct"][what], (rank, what)
    numel, m = 37, 7
    whole = TreeAccumulator(torch.add)
    for i in range(m):
        whole.push(i, _leaf(i, numel))
    assert results[0]["staged"]["exchange"] == combine(whole.nodes(m), m, torch.add).tolist()  # the fixed tree's sum
    initial = weights_digest(build_tiny(SHAPE, 20, seed=0))
    assert results[0]["staged"]["full"] not in (None, initial)  # the update moved the weights
    assert results[1]["staged"]["full"] is None  # the digest is the group's first rank's
    assert {results[r]["staged"]["sync"] for r in range(WORLD)} == {initial}  # rank 0 got the owners' weights
    held = results[1]["staged"]["reshard"][0] + results[2]["staged"]["reshard"][0]
    params = results[0]["staged"]["reshard"][1]
    assert results[0]["staged"]["reshard"][0] == []  # it left the trainer
    assert sorted(h[0] for h in held) == list(range(params))  # every parameter's state, once
    assert all(h[1:] == (3.0 + h[0], h[0] + 0.5, h[0] + 0.25) for h in held), held
    for name in ("model.safetensors", "optimizer.safetensors"):
        staged = (tmp_path / "staged" / "checkpoints" / "step_000001" / name).read_bytes()
        assert staged == (tmp_path / "direct" / "checkpoints" / "step_000001" / name).read_bytes(), name


class _RecordingStream:
    """A side stream on CPU that records when its copies are waited for (`synchronize`)."""

    def __init__(self, timeline: list) -> None:
        self.timeline = timeline

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def synchronize(self) -> None:
        self.timeline.append("sync")


def _reshard_order_rank(rank: int, port: int, queue) -> None:
    """2 -> 1 train devices: rank 0 hands every parameter's state it owned to rank 1. Returns
    rank 0's timeline of sends, side-stream synchronisations and frees of sent state."""
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    timeline: list = []
    streams.side_stream = lambda device: _RecordingStream(timeline)
    streams.synchronize = lambda device: timeline.append("sync")
    real_send = dist.send

    def send(tensor, *args, **kwargs):
        timeline.append("send")
        return real_send(tensor, *args, **kwargs)

    dist.send = send
    shard = _shard(rank, "optimizer", Direct())
    first, end = owner_runs(shard.state.sizes, 2)[rank]
    for i, p in enumerate(shard.trainer.params):
        if first <= i < end:
            state = {"step": torch.tensor(2.0), "exp_avg": torch.full(p.shape, 1.0),
                     "exp_avg_sq": torch.full(p.shape, 2.0)}
            shard.trainer.optimizer.state[p] = state
            weakref.finalize(state["exp_avg"], timeline.append, f"free {i}")
    shard.state.owned.stepped = True
    shard.reshard_optimizer([0, 1], [1], 64)
    shard.wait_optimizer_transfer()
    queue.put((rank, timeline, (len(shard.trainer.optimizer.state), len(shard.trainer.params))))
    dist.destroy_process_group()


def test_sent_optimizer_state_is_freed_only_after_its_copies_are_done():
    """On CUDA the chunk copies out of a sent parameter's state run on a side stream; freeing the
    state before that stream is done hands its memory to the training stream while the copies
    still read it. Every free of sent state must come after a side-stream synchronisation that
    follows the last send out of it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_reshard_order_rank, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = dict((r, (t, n)) for r, t, n in (queue.get(timeout=240) for _ in procs))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    timeline, _ = results[0]
    frees = [i for i, e in enumerate(timeline) if e.startswith("free")]
    assert frees, timeline  # rank 0 sent (and freed) some state
    for at in frees:
        last = [e for e in timeline[:at] if e in ("send", "sync")][-1]
        assert last == "sync", (timeline[at], timeline[max(0, at - 4):at + 1])
    held, params = results[1][1]
    assert held == params  # the one train device left holds every parameter's state


def test_a_full_shard_round_waits_for_a_reshard_on_its_own_thread():
    """The round's collectives (the parameter broadcasts) must not run beside the reshard's
    transfers, which use another communicator from another thread."""
    from poise.runtime.roles import BackgroundTask

    shard = _shard(0, "full", Direct())
    seen = []

    def transfer() -> None:
        time.sleep(0.5)
        seen.append("reshard done")

    def begin_round(ranks, index) -> None:
        seen.append("round collectives")
        raise RuntimeError("stop here: the round's order is what this test reads")

    shard._transfer = type("Transfer", (), {})()
    shard._transfer.task = BackgroundTask(transfer, "a reshard")
    shard.state.gradients.begin_round = begin_round
    with pytest.raises(RuntimeError, match="stop here"):
        shard.train_round(0, [], [1.0], [0, 1])
    assert seen == ["reshard done", "round collectives"], seen
