"""The job's device pool at run time: the worker actors in their roles, and the two services over
them (the stream generation service on the rollout devices, the trainer group on the train devices).
Start-up places the actors and prewarms every communicator the job may use; `shutdown` releases
them and the placement groups. Also what a job decides before it starts: its split
(`choose_split`), the splits a resize may move between and its resize policy."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Protocol, Sequence

import ray
from ray.exceptions import RayActorError, RayTaskError

from poise.config import TrainConfig
from poise.data.prompts import TaskSteps, fitted_context
from poise.data.tasks import Problem
from poise.errors import PoiseError
from poise.policy.controller import ResizePolicy, make_resize_policy
from poise.policy.cost import CostModel
from poise.policy.dispatch import build_dispatch
from poise.policy.plan import plan_step
from poise.policy.split import Split
from poise.rewards.scorer import PendingRewards
from poise import injection, start_up
from poise.runtime import faults
from poise.runtime.cluster import DevicePool, connect, device_pool, rendezvous_key, reserve_pool
from poise.runtime.resize import prewarm_rank_sets
from poise.runtime.scale import scale_rank_sets
from poise.runtime.service import StreamGenerationService
from poise.runtime.storage import CheckpointStore
from poise.runtime.topology import Topology
from poise.runtime.trainer_group import TrainerGroup
from poise.runtime.worker import WorkerSpec, start_devices
from poise.types import Sample


class StepSource(Protocol):
    """Each step's prompts, their token ids, and each sample's reward (data.prompts.TaskSteps,
    runtime.emulated.Emulation)."""

    def problems(self, step: int) -> list[Problem]: ...

    def prompt_ids(self, problem: Problem) -> Sequence[int]: ...

    def draws(self, step: int, draws: list[int]) -> list[Problem]: ...

    def submit_scores(self, problems: list[Problem], samples: list[Sample]) -> PendingRewards:
        """The samples' rewards, computed in the background (the reward sandbox) or already known."""
        ...


class Runtime:
    """The job's devices, roles, communicators, and the two services over them."""

    def __init__(self, cfg: TrainConfig, split: tuple[int, int], source: StepSource, dispatcher=None,
                 emulation=None, run_dir: Path | None = None):
        self.cfg = cfg
        self.workers: list = []
        self.pool: DevicePool | None = None
        self.reserve: DevicePool | None = None
        connect(cfg.cluster, run_dir / "ray.log" if run_dir is not None else None)  # Ray's lines: not the console
        start_up.phase("ray", ("reward sandbox and " if emulation is None else "")
                       + ("Ray joined" if cfg.cluster.address else "Ray started"))
        try:
            self._set_up(split, source, dispatcher, emulation, run_dir)
        except BaseException:  # a failed start releases the placement groups and actors it already held
            self.shutdown()
            raise

    def _set_up(self, split: tuple[int, int], source: StepSource, dispatcher, emulation, run_dir: Path | None) -> None:
        cfg = self.cfg
        c, algo = cfg.cluster, cfg.algorithm
        # checkpoints in the driver's run.dir, through the driver for a node that does not see it;
        # an emulated device writes no files
        self.store = CheckpointStore(run_dir or Path(cfg.run.dir), "shared" if emulation is not None else c.storage,
                                     c.step_timeout_s, self)
        self.pool = device_pool(c)
        self.reserve = reserve_pool(c)  # devices that may join as rollout instances (runtime/scale.py)
        rollout = cfg.rollout
        if emulation is None and isinstance(source, TaskSteps):  # the KV cache sized by the run's prompts
            rollout = dataclasses.replace(rollout, max_context=fitted_context(
                cfg.model, rollout.max_context, source.longest_prompt(), cfg.env.response_tokens(algo.sampling.max_new_tokens)))
        self.spec = WorkerSpec(cfg.model, cfg.data.tokenizer, algo, rollout, cfg.run.seed, c.threads_per_device,
                               cfg.determinism == "bitwise", c.device,
                               emulation.device_spec if emulation is not None else None,
                               c.step_timeout_s, c.gpus_per_device, c.shard, faults=injection.current())
        if emulation is not None:
            self.ranker, default = emulation.ranker, emulation.dispatcher
        else:  # a real job prices the long tail on the default cost model, with step 0's prompt length
            first = source.problems(0)
            prompt_len = round(sum(len(source.prompt_ids(p)) for p in first) / len(first))
            from poise.model.length_ranker import torch_rankers  # torch: real compute only

            self.ranker, default = build_dispatch(cfg.dispatch, cfg.run.seed, CostModel(), prompt_len,
                                                  algo.group_size, rankers=torch_rankers())
        self.dispatcher = dispatcher or default  # tests inject reordering or lossy ones
        self.emulation_cost = emulation.cost if emulation is not None else None
        # wall seconds per cost-model second: the controller prices in model seconds
        self.time_scale = emulation.device_spec.time_scale if emulation is not None else 1.0
        self.service: StreamGenerationService | None = None
        # a hard resize recreates the actors, so it prewarms only the split it starts
        self.transitions = resize_transitions(cfg, split) if cfg.resize.mode == "live" else []
        self.start(Topology.of_split(Split(*split)), self.transitions)

    def start(self, topology: Topology, transitions: list[tuple[Split, Split]]) -> None:
        """Place the devices' worker actors in the pool's bundles, in the roles of `topology`, which
        this installs; `transitions`: the splits a live resize may move between (their groups are
        prewarmed)."""
        c, algo = self.cfg.cluster, self.cfg.algorithm
        port = rendezvous_key()  # device 0 publishes its store's address under it (runtime/worker.py)
        resources = {"num_gpus": c.gpus_per_device} if c.device == "cuda" else {}
        # the thread env of every device process, also on a joined cluster, whose job has none of
        # start_local's runtime_env: the same OpenMP/MKL set-up on every node
        resources["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": str(c.threads_per_device),
                                                 "TOKENIZERS_PARALLELISM": "false"}}
        world = c.devices + c.reserve_devices  # the reserve is in the torch world from the start, idle
        # emulated devices may share a process (runtime/worker.py DeviceHost); real ones never do
        per = self.cfg.emulation.per_process(world) if self.spec.emulated is not None else 1
        self.topology = topology  # a restart (recovery, a hard resize) brings the joined devices in it
        pool_rollout = [d for d in topology.rollout if d not in topology.joined]
        spec = dataclasses.replace(self.spec, train_ranks=tuple(self.train_ranks))  # shard: full loads its run
        self.workers = start_devices(list(range(c.devices)), self.pool.strategy, per, world, port, spec,
                                     num_cpus=1, **resources)
        if c.reserve_devices:
            self.workers += start_devices(list(range(c.devices, world)), self.reserve.strategy, per, world, port,
                                          spec, num_cpus=1, **resources)
        start_up.phase("placed", f"{world} devices placed ({len(topology.rollout)} rollout, "
                                 f"{len(topology.train)} train)")
        # every worker creates the same groups in the same order (dist.new_group is collective):
        # those of this split and of every split a live resize may move to
        groups = prewarm_rank_sets(topology.split, transitions)
        groups += scale_rank_sets(c, self.cfg.scale, self.leader, pool_rollout)  # and of the joins
        if self.cfg.pipeline.assist and list(range(c.devices)) not in groups:  # train + helping rollout devices
            groups.append(list(range(c.devices)))
        faults.wait([w.prewarm_groups.remote(groups) for w in self.workers], list(range(len(self.workers))),
                    "start-up (model build and communicators)", max(c.step_timeout_s, faults.START_UP_S))
        start_up.phase("loaded", f"model loaded on {world} devices")
        faults.wait([self.workers[d].set_role.remote("rollout") for d in self.rollout_ranks]
                    + [self.workers[d].set_role.remote("train") for d in self.train_ranks],
                    self.rollout_ranks + self.train_ranks, "start-up", c.step_timeout_s)
        old = self.service
        self.service = StreamGenerationService([self.workers[d] for d in self.rollout_ranks], self.rollout_ranks,
                                               self.dispatcher, self.ranker, algo.group_size,
                                               self.cfg.rollout.num_slots, step_timeout_s=c.step_timeout_s,
                                               **self.train_devices_in_generation())
        if old is not None:  # a hard resize: what the old service knew of samples not yet logged
            self.service.instance_of, self.service.busy = old.instance_of, old.busy
        self.trainer = TrainerGroup([self.workers[d] for d in self.train_ranks], self.train_ranks,
                                    algo.advantage, self.cfg.pipeline.streaming, algo.loss_agg, c.step_timeout_s,
                                    rounds=self.fully_sharded, std_eps=algo.std_eps,
                                    **self.rollout_devices_in_training())

    @property
    def sharded(self) -> bool:
        """`cluster.shard: optimizer | full` on real compute: each train device owns part of the
        optimizer state, so a checkpoint needs every train device and a resize reshards."""
        return self.cfg.cluster.shard != "none" and self.spec.emulated is None

    @property
    def fully_sharded(self) -> bool:
        """`cluster.shard: full` on real compute: the parameters are sharded too, so a weight sync
        comes from every owner and the weights' digest needs every train device."""
        return self.cfg.cluster.shard == "full" and self.spec.emulated is None

    def sync_senders(self) -> list[int]:
        """The devices a weight sync comes from: the train leader, or every owner (`shard: full`)."""
        return list(self.train_ranks) if self.fully_sharded else [self.leader]

    def publish_refs(self, version: int, after: list | None) -> list:
        """Queue weights `version` to every rollout device (`publish_weights_refs`), behind `after`."""
        owners = {d: self.workers[d] for d in self.train_ranks} if self.fully_sharded else None
        return self.service.publish_weights_refs(self.workers[self.leader], self.leader, version,
                                                 self.cfg.rollout.weight_bucket_mb, after, owners)

    def rollout_devices_in_training(self) -> dict:
        """`pipeline.assist`: the pool's rollout devices (a joined reserve device is not in the
        prewarmed group of the pool), which compute a share of the training tail."""
        ranks = [d for d in self.rollout_ranks if d not in self.topology.joined] if self.cfg.pipeline.assist else []
        return {"helpers": [self.workers[d] for d in ranks], "helper_ranks": ranks}

    def train_devices_in_generation(self) -> dict:
        """`pipeline.assist`: the train devices, which generate beside the rollout devices while
        a sync step generates (they hold that step's weights)."""
        ranks = list(self.train_ranks) if self.cfg.pipeline.assist else []
        return {"lenders": [self.workers[d] for d in ranks], "lender_devices": ranks}

    def stop(self) -> None:
        """Shut every worker down and kill its actor (the placement group stays); a dead or hung
        actor is killed without waiting for it."""
        faults.stop_workers(self.workers, faults.PROBE_S)

    @property
    def split(self) -> Split:
        return self.topology.split

    @property
    def rollout_ranks(self) -> list[int]:
        return list(self.topology.rollout)

    @property
    def train_ranks(self) -> list[int]:
        return list(self.topology.train)

    @property
    def leader(self) -> int:
        return self.topology.leader

    def install(self, topology: Topology) -> None:
        """Work in the roles of `topology` (a live resize's or a join's: the actors stay). The
        trainer and the lent rollout instances follow the train group when it changes; between
        steps, so nothing of a step is in flight."""
        regroup = topology.train != self.topology.train
        self.topology = topology
        if regroup:
            self.trainer.set_devices([self.workers[d] for d in self.train_ranks], self.train_ranks,
                                     **self.rollout_devices_in_training())
            self.service.set_lenders(**self.train_devices_in_generation())

    def publish_weights_refs(self, version: int) -> list:
        """Queue weights `version` from the train leader to every rollout device behind the step's
        last update (generation is over: the rollout devices are free to receive)."""
        return self.publish_refs(version, [self.trainer.last_update_ref()])

    def digests(self) -> tuple[str, list[str]]:
        """The train leader's weights digest and every rollout device's."""
        senders = self.sync_senders()  # shard: full: every owner takes part, the leader answers
        devices = senders + self.rollout_ranks
        digests = faults.wait([self.workers[d].weights_digest.remote() for d in devices], devices,
                              "the weight-sync check", self.cfg.cluster.step_timeout_s, self)
        return digests[0], digests[len(senders):]

    def shutdown(self) -> None:
        """Stop the actors and release the placement groups (also those of a start that failed midway)."""
        vllm = self.cfg.rollout.backend == "vllm" and self.spec.emulated is None
        pids = self.device_pids() if vllm and getattr(self, "workers", None) else []
        self.stop()
        if self.pool is not None:
            self.pool.release()
        if self.reserve is not None:
            self.reserve.release()
        if vllm:
            # what the vLLM engines of devices killed before their engine's release (a crash, a
            # recovery, a shutdown past its deadline) left on this node's /dev/shm: swept once
            # their processes are gone (a killed actor's process ends a moment after the kill)
            from poise.rollout.vllm_engine import sweep_stale_shm

            deadline = time.time() + faults.PROBE_S
            while time.time() < deadline and any(_alive(pid) for pid in pids):
                time.sleep(0.1)
            sweep_stale_shm()

    def device_pids(self) -> list[int]:
        """The processes of the devices on this node that answer within PROBE_S."""
        refs = [w.process_and_node.remote() for w in self.workers]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=faults.PROBE_S)
        here = ray.get_runtime_context().get_node_id()
        pids = []
        for ref in ready:
            try:
                pid, node = ray.get(ref)
            except (RayActorError, RayTaskError):
                continue
            if node == here:
                pids.append(pid)
        return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that pid
        return True
    return True


def resize_transitions(cfg: TrainConfig, initial: tuple[int, int]) -> list[tuple[Split, Split]]:
    """Every (from, to) split a resize of this job may make: the schedule's chain, or any pair of
    the controller's allowed splits."""
    r = cfg.resize
    first = Split(*initial)
    if r.schedule:
        chain = [first] + list(r.scheduled().values())
        return [(a, b) for a, b in zip(chain, chain[1:]) if a != b]
    if r.policy == "controller":
        from poise.policy.split import all_splits, parse_splits

        allowed = set(parse_splits(r.allowed_splits, "resize.allowed_splits") or all_splits(cfg.cluster.devices))
        allowed.add(first)
        ordered = sorted(allowed, key=lambda s: s.rollout)
        return [(a, b) for a in ordered for b in ordered if a != b]
    return []


def resize_policy(cfg: TrainConfig, emulation_cost: CostModel | None) -> ResizePolicy:
    """The job's resize policy, as the simulator builds it. Its cost model: the scenario's under
    emulated compute; on real compute this machine's `poise profile` (cluster.profile), else the
    built-in model, which the controller calibrates to the measured step phases."""
    cost = emulation_cost
    if cost is None:
        cost = CostModel()
        if cfg.cluster.profile is not None:
            import json

            path = Path(cfg.cluster.profile)
            try:
                cost = CostModel.from_profile(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise PoiseError(f"cluster.profile '{path}' is not a `poise profile` JSON ({e}); "
                                 "write one with `poise profile --out PATH` or drop cluster.profile") from None
    a = cfg.algorithm
    micro = sum(len(m.micro) for m in plan_step(0, a.prompts_per_step, a.group_size,
                                                 updates_per_step=a.updates_per_step,
                                                 micro_batch_size=a.micro_batch_size).minis)
    return make_resize_policy(cfg.resize, cfg.controller, cost, cfg.pipeline.kind, cfg.cluster.devices, 1,
                              cfg.rollout.num_slots, micro)


def choose_split(cfg: TrainConfig, source: StepSource) -> tuple[int, int]:
    if cfg.cluster.split:
        return cfg.cluster.split[0], cfg.cluster.split[1]
    from poise.policy.allocator import StepWorkload, allocate

    # A representative step: step 0's prompts, their reference answers' lengths (+EOS), and the
    # step plan's micro-batch count.
    a = cfg.algorithm
    problems = source.problems(0)
    lengths = tuple(len(p.answer) + 1 for p in problems for _ in range(a.group_size))
    prompt_len = round(sum(len(source.prompt_ids(p)) for p in problems) / len(problems))
    plan = plan_step(0, a.prompts_per_step, a.group_size, updates_per_step=a.updates_per_step,
                     micro_batch_size=a.micro_batch_size)
    alloc = allocate(CostModel(), StepWorkload(lengths, prompt_len), cfg.cluster.devices, cfg.pipeline.kind,
                     batch_caps=(cfg.rollout.num_slots,), micro_batches=sum(len(m.micro) for m in plan.minis))
    return alloc.split.rollout, alloc.split.train
