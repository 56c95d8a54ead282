"""One long-lived worker actor per device. Its role (rollout engine or train shard) changes; the
actor does not (docs/design.md, "Device pool").

The worker holds three role objects behind the Protocols of `runtime/roles.py` and delegates to
them; real compute (`runtime/train_shard.py` and `runtime/weight_sync.py`, torch) and emulated
compute (`runtime/emulated.py`, sleeps priced by the cost model, no torch in the process) are two
implementations of the same roles. The rollout engine runs on its own thread (`EngineLoop`): the
driver hands requests in with `submit` and collects finished samples in batches with `take`.

One exception to one process per device, for emulated compute only: `DeviceHost` holds several
emulated devices in one process (`emulation.devices_per_process`; a Ray process alone costs
~60 MiB), each with its own thread and its calls in the driver's order.
"""

from __future__ import annotations

import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import ray

from poise.injection import FaultInjector, NoFaults, install
from poise.runtime.hosting import HostedDevice
from poise.runtime.roles import EngineLoop, PrefetchedSamples
from poise.runtime.storage import FileEndpoint

Role = Literal["rollout", "train", "idle"]


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to build its roles; each part is its own config section."""

    model: object  # poise.config.ModelConfig
    tokenizer: str
    algorithm: object  # poise.config.AlgorithmConfig
    rollout: object  # EngineConfig
    seed: int
    threads: int
    bitwise: bool
    device: str  # "cpu" | "cuda"
    emulated: object = None  # poise.runtime.emulated.EmulatedSpec: cluster.compute emulated, no model
    step_timeout_s: float = 600.0  # gloo collectives give up after this long (a dead or hung peer)
    gpus_per_device: float = 1.0  # cuda below 1: devices share a GPU, so their collectives go over gloo
    shard: str = "none"  # cluster.shard: none | optimizer | full (poise.training.state)
    faults: FaultInjector = field(default_factory=NoFaults)  # poise/injection.py: none unless a run injects them
    train_ranks: tuple[int, ...] = ()  # the train devices the actors start in (shard: full builds only its run)


class Device(FileEndpoint):
    """A device's calls; `DeviceWorker` is this class as a Ray actor (one process per device), and
    `DeviceHost` holds several emulated ones in one process."""

    def __init__(self, rank: int, world_size: int, rendezvous: str, spec: WorkerSpec):
        self.rank = rank
        self.role: Role = "idle"
        self.version = 0
        self.faults = spec.faults
        if not isinstance(spec.faults, NoFaults):  # a given injector: this process's checkpoint writes see it too
            install(spec.faults)
        build = _emulated_roles if spec.emulated is not None else _real_roles
        engine, self.shard, self.sync = build(rank, world_size, rendezvous, spec, self._with_engine)
        self.loop = EngineLoop(engine)
        self.prefetched: dict[tuple[int, int, int], list] = {}  # prefetch_samples: key -> a micro-batch's samples

    def _with_engine(self, fn):
        return self.loop.with_engine(fn)

    # ---- role and communicators ---------------------------------------------------------------
    def set_role(self, role: Role) -> Role:
        if role == "train" and self.role != "train":  # a train device holds no generation memory
            self.loop.with_engine(lambda engine: engine.release())
        self.role = role
        return role

    def prewarm_groups(self, rank_sets: list[list[int]]) -> int:
        """Create (collectively, in this order) every group the job may use; returns cache size."""
        return self.sync.prewarm(rank_sets)

    def weights_digest(self) -> str:
        return self.shard.digest()

    def parameter_bytes(self) -> int:
        """Bytes of weights this device holds now (`shard: full`: its own run at rest)."""
        return sum(p.untyped_storage().nbytes() for p in self.shard.trainer.params)

    def held_version(self) -> int:
        """The weights version this device holds; also the fault handler's liveness probe."""
        return self.version

    def loaded_torch(self) -> bool:
        """Whether this actor's process imported torch (an emulated one must not)."""
        return "torch" in sys.modules

    def process_id(self) -> int:
        """The pid of the process this device runs in (emulated devices may share one)."""
        return os.getpid()

    def process_and_node(self) -> tuple[int, str]:
        """(pid, Ray node id) of this device's process: the driver waits for the ones on its node
        to end before it sweeps what they may have left on /dev/shm."""
        return os.getpid(), ray.get_runtime_context().get_node_id()

    # ---- rollout role -------------------------------------------------------------------------
    def submit(self, requests: list, cap: int) -> None:
        """Queue requests; at most `cap` are inside the engine at once (the dispatcher's cap)."""
        self.faults.before_submit(self.rank, [r.sample_id[0] for r in requests])
        self.loop.submit(requests, cap)

    def take(self, timeout: float, linger: float = 0.0) -> tuple[list, int, list[tuple[float, float]], int]:
        """Finished samples (waiting up to `timeout` s for the first, then up to `linger` s for
        those finishing close behind it: `EngineLoop.take`), requests still in flight, the busy
        intervals (wall clock) closed since the last take, and the engine's step count (the
        generation heartbeat: runtime/faults.py)."""
        return (*self.loop.take(timeout, linger), self.loop.steps)

    def abort_generation(self) -> tuple[list, list, list]:
        """A live resize takes this rollout device: (finished samples not yet taken, partial samples,
        requests never started); nothing stays in flight here."""
        return self.loop.abort()

    def resume_generation(self, partials: list, requests: list, cap: int, windows: dict | None = None) -> None:
        """Continue another device's partial samples (same tokens: docs/design.md invariant 2), then
        its unstarted requests; `windows`: partial rollouts' per-sample token budgets."""
        self.loop.resume(partials, requests, cap, windows)

    # ---- live resize --------------------------------------------------------------------------
    def become(self, role: Role, version: int) -> int:
        """Switch role in place. To rollout: the engine starts from the weights this device holds
        (it shares the trainer's module tree) at weights `version`; the optimizer state is freed.
        To train: the weights are already those of `version` (synced as a rollout device); the
        optimizer state arrives by `transfer_optimizer`. Returns the weights version held."""
        if self.role == "rollout" and self.version != version:  # a train device holds the latest by construction
            raise RuntimeError(f"device {self.rank} holds weights version {self.version}, the job is at "
                               f"{version}; a live resize happens only between a sync and the next update")
        self.version = version
        if role == "rollout" and self.role == "train":
            self.shard.drop_optimizer()
            self.loop.with_engine(lambda engine: engine.set_weights_version(version))
        if role == "train" and self.role == "rollout":  # the KV cache's memory goes to the optimizer state
            self.loop.with_engine(lambda engine: engine.release())
        self.role = role
        return self.version

    def generation_bytes(self) -> int:
        """Bytes the rollout engine holds now (KV cache and noise table; 0 where it never generated)."""
        return self.loop.with_engine(lambda engine: getattr(engine, "cache_bytes", 0))

    def restore_version(self, version: int) -> int:
        """Emulated compute's reload after a hard resize: no weights exist, only their version."""
        self.version = version
        self.loop.with_engine(lambda engine: engine.set_weights_version(version))
        return version

    def transfer_optimizer(self, src: int, ranks: list[int], buffer_bytes: int) -> None:
        """Send (rank == src) or receive the optimizer state over the cached group of `ranks`, in the
        background; this device's next update (or checkpoint) waits for it."""
        self.shard.transfer_optimizer(src, ranks, buffer_bytes)

    def optimizer_transfer_report(self) -> dict:
        return self.shard.optimizer_transfer_report()

    def groups_created_after_prewarm(self) -> int:
        """Communicators created after `prewarm_groups`: a live resize must find all it needs cached."""
        return self.sync.groups_created_after_prewarm()

    # ---- train role ---------------------------------------------------------------------------
    def prefetch_samples(self, key: tuple[int, int, int], samples: list) -> None:
        """A micro-batch's samples, sent ahead of the call that trains it (Ray fetches them before
        this call runs, while generation goes on); `key` = (step, mini-batch, micro-batch). What a
        step older than the one before `key`'s left here (a micro-batch that went elsewhere) goes."""
        self.prefetched = {k: v for k, v in self.prefetched.items() if k[0] >= key[0] - 1}
        self.prefetched[key] = samples

    def train_micro_batches(self, batches: list[tuple[int, object, list[float]]]) -> list[dict]:
        """Forward/backward of each (micro-batch index, its samples' ObjectRef or PrefetchedSamples,
        their advantages), in the order given; returns each one's stats. A train device lent to
        generation (`pipeline.assist`) starts them once its engine is done (the samples are fetched
        meanwhile): run beside it, they would share the device's threads and slow the generation
        every other device waits for (as the simulator assumes too)."""
        fetched = iter(ray.get([x for _, x, _ in batches if not isinstance(x, PrefetchedSamples)]))
        self.loop.wait_idle()
        samples = [self.prefetched.pop(x.key) if isinstance(x, PrefetchedSamples) else next(fetched)
                   for _, x, _ in batches]
        self.faults.before_train(self.rank, [s.sample_id[0] for batch in samples for s in batch])
        return [self.shard.train_micro_batch(j, s, adv) for (j, _, adv), s in zip(batches, samples)]

    def train_rounds(self, rounds: list, ranks: list[int]) -> list[dict]:
        """`cluster.shard: full`: lockstep rounds with the other train devices `ranks`, each this
        device's (micro-batch index, samples, advantages) of the round or None (a stand-in: it has
        no micro-batch left in the mini-batch); returns the stats of the real ones, in order."""
        refs = [x for entry in rounds if entry is not None for x in [entry[1]] if not isinstance(x, PrefetchedSamples)]
        fetched = iter(ray.get(refs))
        out = []
        for entry in rounds:
            if entry is None:
                self.shard.train_round(None, None, None, ranks)
                continue
            j, x, adv = entry
            samples = self.prefetched.pop(x.key) if isinstance(x, PrefetchedSamples) else next(fetched)
            self.faults.before_train(self.rank, [s.sample_id[0] for s in samples])
            out.append(self.shard.train_round(j, samples, adv, ranks))
        return out

    def gather_weights(self, new_ranks: list[int]) -> tuple[int, int]:
        """`cluster.shard: full`, before a live resize (every old train device): the whole model
        on a device that leaves the trainer, its run among `new_ranks` on one that stays; returns
        the most weight bytes it held at once and the weight bytes it received."""
        return self.shard.gather_weights(new_ranks)

    def shard_weights(self, ranks: list[int]) -> None:
        """`cluster.shard: full`, a device that joined the trainer: its run among `ranks` alone."""
        self.shard.shard_weights(ranks)

    def apply_update(self, num_micro_batches: int, indices: list[int], normaliser: float, ranks: list[int],
                     rows: int, after: list | None = None, requires: list | None = None,
                     version: int | None = None) -> dict:
        """One reduction (of micro-batches `indices` here with those of the other `ranks`) and
        optimizer step; the leader's `after` holds every micro-batch of the mini-batch, so the
        update it publishes ends after the last one (the all-gather imposes that on every rank with
        real compute; an emulated shard has no collective). `requires`: calls that must have
        succeeded first (runtime/faults.py: a device never enters a collective that a failed or
        dead peer cannot join, where it would wait for gloo's timeout). `version`: the weights version
        the step's last update makes; samples this device generates next carry it (`pipeline.assist`)."""
        if requires:
            ray.get(requires)
        inputs_ready = None
        if after:  # every micro-batch's record: the last one's end is when the all-gather could start
            inputs_ready = max(record["end"] for records in ray.get(after) for record in records)
        self.loop.wait_idle()  # a train device lent to generation (pipeline.assist) has finished it
        out = self.shard.apply_update(num_micro_batches, indices, normaliser, ranks, rows, inputs_ready)
        self.version = self.version + 1 if version is None else version
        if version is not None:
            self.loop.with_engine(lambda engine: engine.set_weights_version(version))
        return out

    def contribute(self, num_micro_batches: int, indices: list[int], ranks: list[int], rows: int,
                   requires: list | None = None) -> dict:
        """`pipeline.assist`: this rollout device's gradients of micro-batches `indices` join the
        train devices' reduction; the weights (and version) stay until the weight sync."""
        if requires:
            ray.get(requires)
        return self.shard.contribute(num_micro_batches, indices, ranks, rows)

    # ---- weight sync ------------------------------------------------------------------------
    def sync_weights(self, src: int, ranks: list[int], version: int, bucket_mb: float, after: list | None = None,
                     requires: list | None = None, sources: list[int] | None = None) -> float:
        """Send or receive weights `version`; `after` holds the train leader's last update of the
        step, so a sync can be queued before that update ends (the barrier a collective is anyway).
        `requires`: calls that must have succeeded first (the sender's own update: see apply_update).
        `sources` (`cluster.shard: full`): the train devices, each sending the parameters it owns."""
        if requires:
            ray.get(requires)
        sender_ready = None
        if after:  # the leader's update record: when the sender entered the sync
            sender_ready = max(record["end"] for record in ray.get(after))
        self.faults.sync_started(self.rank, version)
        seconds = self.sync.publish(src, ranks, version, bucket_mb, sender_ready, sources)
        self.faults.sync_finished(self.rank, version)
        self.version = version
        return seconds

    def evaluate(self, greedy: list, sampled: list, rollout, sampling) -> list:
        """Held-out responses (poise.evaluation) under the weights this rollout device holds, on
        engines of their own over the same modules, while its engine loop waits between two steps:
        the rollout engine's slots, queue and weights version stay as they were."""
        from poise.evaluation.engine import generate_heldout

        return self.loop.with_engine(lambda engine: generate_heldout(
            engine.model, rollout, sampling, engine.seed, engine.eos_id, engine.version, greedy, sampled))

    def save_checkpoint(self, run_dir: str, step: int, version: int, extra: dict[str, bytes] | None = None,
                        ranks: list[int] | None = None, parallel: bool = False) -> str:
        """`extra`: more files for the checkpoint (an async run's next samples); `ranks`
        (`cluster.shard: optimizer | full`): the train devices, each running `send_optimizer_state`;
        `parallel`: each of them writes its own part into the files in place."""
        return self.shard.save_checkpoint(run_dir, step, version, extra, ranks, parallel)

    def send_optimizer_state(self, writer: int, ranks: list[int], parallel: bool = False) -> None:
        """`cluster.shard: optimizer | full`: this owner's part of the checkpoint device `writer`
        saves: sent to it, or (`parallel`) written into its files in place."""
        self.shard.send_optimizer_state(writer, ranks, parallel)

    def reshard_optimizer(self, old_ranks: list[int], new_ranks: list[int], buffer_bytes: int) -> None:
        """`cluster.shard: optimizer`, live resize: the owners' state moves to the new owners in the
        background; this device's next update (or checkpoint) waits for it."""
        self.shard.reshard_optimizer(old_ranks, new_ranks, buffer_bytes)

    def load_checkpoint(self, path: str, train_ranks: list[int] | None = None) -> tuple[int, int]:
        """Restore weights, optimizer and RNG from a checkpoint; returns (step, weights version).
        `train_ranks`: the train devices from now on (which optimizer state this device takes)."""
        step, self.version = self.shard.load_checkpoint(path, train_ranks)
        return step, self.version

    def shutdown(self) -> None:
        """Stop generating and give back what the engine holds outside this process (vLLM's engine
        process, its weights file and shared memory on /dev/shm), which outlive a killed actor."""
        try:
            self.loop.abort()  # release needs an idle engine; the job is over, the partials go
            self.loop.with_engine(lambda engine: engine.release())
        finally:
            self.loop.close()


@ray.remote
class DeviceWorker(Device):
    """One device in a Ray actor process of its own."""


@ray.remote
class DeviceHost:
    """Several emulated devices in one Ray actor process (`emulation.devices_per_process`). A Ray
    worker process costs ~60 MiB before it imports anything and an emulated device's roles ~4 MiB,
    so 64 emulated devices in 64 processes would hold ~4 GB to sleep. Each device keeps what an
    actor of its own gives it: its calls run one at a time on a thread of its own, in the order
    the driver submitted them (numbered by `runtime/hosting.py` HostedDevice); the host's devices
    run concurrently. Real compute keeps one process per device (its torch.distributed rank)."""

    def __init__(self, ranks: list[int], world_size: int, rendezvous: str, spec: WorkerSpec):
        if spec.emulated is None:
            raise ValueError("DeviceHost holds emulated devices only; real compute runs a DeviceWorker per device")
        self.devices = {r: Device(r, world_size, rendezvous, spec) for r in ranks}
        self.threads = {r: ThreadPoolExecutor(1, thread_name_prefix=f"device-{r}") for r in ranks}
        self.next_call = dict.fromkeys(ranks, 0)
        self.turns: asyncio.Condition | None = None  # made on the actor's event loop

    async def call(self, rank: int, number: int, method: str, *args, **kwargs):
        """Device `rank`'s call `number` (from 0, per device): queued on the device's thread once
        every earlier call of that device is queued, so the thread runs them in order."""
        if self.turns is None:
            self.turns = asyncio.Condition()
        async with self.turns:
            await self.turns.wait_for(lambda: self.next_call[rank] == number)
            done = asyncio.get_running_loop().run_in_executor(self.threads[rank], self._run, rank, method, args,
                                                              kwargs)
            self.next_call[rank] += 1
            self.turns.notify_all()
        return await done

    def _run(self, rank: int, method: str, args: tuple, kwargs: dict):
        return getattr(self.devices[rank], method)(*args, **kwargs)


def start_devices(ranks: list[int], bundle, per_process: int, world_size: int, rendezvous: str, spec: WorkerSpec,
                  **options) -> list:
    """An actor handle per device of `ranks`, the i-th in bundle `bundle(i)` of its placement
    group: a DeviceWorker each, or (`per_process` > 1, emulated compute) a DeviceHost per
    `per_process` consecutive ranks, in the bundle of its first, and a HostedDevice per device."""
    if per_process <= 1:
        return [DeviceWorker.options(scheduling_strategy=bundle(i), **options).remote(r, world_size, rendezvous, spec)
                for i, r in enumerate(ranks)]
    env = options.get("runtime_env", {}).get("env_vars", {})
    # a device's blocking ray.get runs on its own thread, never on the host's event loop
    options["runtime_env"] = {"env_vars": {**env, "RAY_WARN_BLOCKING_GET_INSIDE_ASYNC": "0"}}
    handles: list = []
    for first in range(0, len(ranks), per_process):
        chunk = ranks[first:first + per_process]
        host = DeviceHost.options(scheduling_strategy=bundle(first), **options).remote(chunk, world_size, rendezvous,
                                                                                       spec)
        handles += [HostedDevice(host, r) for r in chunk]
    return handles


def _real_roles(rank: int, world_size: int, rendezvous: str, spec: WorkerSpec, engine_call):
    """A model, its engine (sharing the module tree: a train->rollout switch copies no weight), a
    torch train shard and the broadcast sync, in one torch.distributed world (gloo/NCCL)."""
    import datetime
    import time

    import torch
    import torch.distributed as dist

    from poise.data.tokenizer import load_tokenizer
    from poise.rollout.backends import build_engine
    from poise.runtime.communicators import CommunicatorCache
    from poise.runtime.train_shard import TorchTrainShard
    from poise.runtime.weight_sync import BroadcastSync
    from poise.training.determinism import bitwise_cuda
    from poise.training.setup import pin_threads
    from poise.training.trainer import PolicyTrainer

    pin_threads(spec.threads, spec.bitwise)
    torch.manual_seed(spec.seed)  # the colocated loop's RNG state, saved in checkpoints
    device = torch.device("cuda", 0) if spec.device == "cuda" else torch.device("cpu")
    timeout = datetime.timedelta(seconds=spec.step_timeout_s)  # a dead peer must not hold a survivor for 30 min
    from poise.runtime.cluster import collective_backend
    from poise.runtime.faults import START_UP_S

    # the rendezvous waits for the slowest actor's start (model imports on a loaded machine)
    store = join_rendezvous(rank, world_size, rendezvous, max(timeout, datetime.timedelta(seconds=START_UP_S)))
    dist.init_process_group(collective_backend(spec.device, spec.gpus_per_device), store=store, rank=rank,
                            world_size=world_size, timeout=timeout)
    from poise.runtime.transport import transport_for

    # decided once for the world's backend and this device: staged through host memory where gloo
    # would get CUDA tensors (devices sharing a GPU), direct otherwise
    comm = CommunicatorCache(timeout, transport_for(dist.get_backend(), device))
    tokenizer = load_tokenizer(spec.tokenizer, spec.model.path)
    dtype = getattr(torch, spec.model.dtype)  # model.dtype: the driver checked it and said what it had to
    owners = _starting_owners(spec, rank)
    keep = None if owners is None else _own_run(spec.model.path, dtype, owners, rank)
    model = _initial_policy(spec, tokenizer, device, dtype, keep)
    if spec.model.lora is not None:  # every device: the engine applies the adapter too
        from poise.model.lora import attach_adapter

        attach_adapter(model, spec.model.lora, spec.seed)
    if spec.bitwise:  # cuBLAS workspace, math attention, the strict probe: before any kernel (no-op on CPU)
        bitwise_cuda(device, model.config.model_type)
    ref = None
    if spec.algorithm.kl_coef > 0:  # built at this device's first micro-batch: a rollout device holds none
        def ref():
            return _initial_policy(spec, tokenizer, device, dtype).requires_grad_(False).eval()
    trainer = PolicyTrainer(model, spec.algorithm, tokenizer.pad_id, ref)
    engine = build_engine(model, spec.rollout, spec.algorithm.sampling, spec.seed, tokenizer.eos_id, clock=time.time)

    def set_version(version: int) -> None:
        engine_call(lambda e: e.set_weights_version(version))

    shard = TorchTrainShard(rank, trainer, comm, spec.bitwise, device, set_version, spec.shard)
    if owners is not None:
        shard.adopt(owners)
    return engine, shard, BroadcastSync(rank, model, comm, device, engine_call)


def _starting_owners(spec: WorkerSpec, rank: int) -> list[int] | None:
    """`shard: full`, a checkpoint directory, several train devices and this one among them: the
    train devices it starts sharded over (it loads its own run of the weights alone); else None."""
    ranks = sorted(spec.train_ranks)
    if spec.shard != "full" or spec.model.path is None or len(ranks) < 2 or rank not in ranks:
        return None
    return ranks


def _emulated_roles(rank: int, world_size: int, rendezvous: str, spec: WorkerSpec, engine_call):
    """Compute replaced by cost-model sleeps; no model, no torch, no torch.distributed world."""
    from poise.runtime.emulated import emulated_roles

    return emulated_roles(rank, spec.emulated, spec.rollout.num_slots, engine_call)


_LISTENER = []  # device 0's store socket, alive as long as the process


def join_rendezvous(rank: int, world_size: int, key: str, timeout):
    """The torch.distributed store of this job's world, on device 0's node address as Ray reports
    it (loopback for a local Ray) and bound to that interface only (the default store listens on
    every interface, open to the whole network). Device 0 binds a free port there and publishes `host:port` in
    Ray's internal key-value store under `key`; the others read it from there. gloo's own sockets
    go on the interface of this node's address."""
    import socket
    import time

    import torch.distributed as dist
    from ray.experimental import internal_kv

    from poise.runtime.cluster import interface_of

    here = ray.util.get_node_ip_address()
    interface = interface_of(here)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)  # NCCL's bootstrap and socket transport: the same one
    # 2 = CleanUpOnly: a collective whose peer died or hung past the timeout aborts its communicator and
    # raises in this process, which lives on to be recovery's surviving replica. Torch's default (3)
    # tears the process down, and without handling the CUDA stream stays stuck behind the collective.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    if rank == 0:
        listener = socket.socket(socket.AF_INET6 if ":" in here else socket.AF_INET)
        listener.bind((here, 0))
        listener.listen(max(128, world_size))
        _LISTENER.append(listener)
        port = listener.getsockname()[1]
        store = dist.TCPStore(here, port, world_size, True, timeout=timeout, wait_for_workers=False,
                              master_listen_fd=listener.fileno())
        internal_kv._internal_kv_put(key, f"{here}|{port}", overwrite=True)
        return store
    deadline = time.time() + timeout.total_seconds()
    while (found := internal_kv._internal_kv_get(key)) is None:
        if time.time() > deadline:
            raise RuntimeError(f"device {rank}: device 0 published no rendezvous address within {timeout}")
        time.sleep(0.05)
    host, port = found.decode().split("|")
    return dist.TCPStore(host, int(port), world_size, False, timeout=timeout)


def _own_run(path: str, dtype, owners: list[int], rank: int) -> set[str]:
    """The names of the parameters device `rank` owns among train devices `owners` (the trainer's
    parameters in order, training/state/placement.py `owner_runs`), from the checkpoint's shapes alone."""
    from poise.model.loading import load_model
    from poise.training.state.placement import owner_runs

    named = [(n, p) for n, p in load_model(path, dtype, "meta").named_parameters() if p.requires_grad]
    first, end = owner_runs([p.numel() for _, p in named], len(owners))[owners.index(rank)]
    return {n for n, _ in named[first:end]}


def _initial_policy(spec: WorkerSpec, tokenizer, device, dtype, keep: set[str] | None = None):
    """Every device builds the same initial weights: a local checkpoint, loaded straight onto the
    device in the compute dtype, or the seeded tiny model (made in float32 on the CPU: its weights
    are a function of the seed there, then cast). `keep`: only these parameters of the checkpoint
    are read (`shard: full`); the others keep their shapes with no storage."""
    from poise.model.loading import build_tiny, load_model

    if spec.model.path is not None:
        return load_model(spec.model.path, dtype, device, keep=keep)
    return build_tiny(spec.model.tiny, tokenizer.vocab_size, spec.seed, tokenizer.eos_id, tokenizer.pad_id,
                      tokenizer.bos_id).to(device, dtype)
