"""The disaggregated driver loop: `pipeline.mode` sync or async over one device pool.

sync   step k: generate with weights k, stream each sample to the trainer, update -> k+1, publish.
async  step k: the trainer updates on step k's samples (made with weights k-1) while rollout
       generates step k+1 with weights k; then weights k+1 are published. Exact staleness 1
       (docs/design.md invariant 4); step 0 uses the initial weights, the only ones there are.

Prompts, sampling, the step plan (poise.policy.plan) and the reduction order are those of the
colocated loop, so in `determinism: bitwise` every sample and every update equals the colocated
reference's. Prompts and rewards come from a `StepSource`: the tasks (real compute) or a
scenario (emulated compute); the driver does not know which.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Protocol, Sequence

import ray
from ray.exceptions import RayActorError, RayTaskError

from poise.config import TrainConfig
from poise.data.prompts import TaskSteps, fitted_context, make_prompt_source, make_tokenizer
from poise.data.tasks import Problem
from poise.episodes.codec import TurnCodec
from poise.episodes.metrics import episode_event_fields, episode_metrics, with_env_rewards
from poise.episodes.runner import EpisodeRunner
from poise import interrupt
from poise.errors import PoiseError
from poise.algo.shaping import overlong_penalty
from poise.metrics import step_metrics
from poise.policy.controller import ResizeController, ResizePolicy, StepObservation, make_resize_policy
from poise.policy.cost import CostModel
from poise.policy.dispatch import build_dispatch
from poise.policy.dynamic import DrawResolver, default_max_draws
from poise.policy.plan import StepPlan, plan_step
from poise.policy.split import Split
from poise.rewards.functions import resolve_functions
from poise.rewards.scorer import PendingRewards, RewardResult, RewardScorer, log_failures, reward_metrics
from poise.rundir import prepare_run_dir, resume_line, run_clock, truncate_logs
from poise.runlog import RunLog
from poise.runtime import faults
from poise.runtime.evaluation import RolloutEvaluation
from poise.runtime.cluster import DevicePool, connect, device_pool, rendezvous_key, reserve_pool
from poise.runtime.resize import ResizeReport, finish_report, hard_resize, live_resize, prewarm_rank_sets
from poise.runtime.scale import ScaleOut, scale_rank_sets
from poise.runtime.service import StreamGenerationService
from poise.runtime.storage import CheckpointStore
from poise.runtime.trainer_group import TrainerGroup
from poise.runtime.worker import WorkerSpec, start_devices
from poise.schema import dump, to_dict
from poise.training.checkpoint import (PENDING_SAMPLES, check_finite, checkpoint_dir, decode_samples,
                                    encode_samples, latest_checkpoint, prune_before_save, prune_checkpoints)
from poise.training.progress import StepProgress
from poise.types import Sample, SampleId, trained_tokens

SCORE_WAIT_S = 0.02  # how long the driver waits for a just-arrived batch's rewards before taking the next batch
DYNAMIC_DRAWS = "dynamic_draws.json"  # an async checkpoint's next step: which draw each slot holds


@dataclasses.dataclass
class DynamicStep:
    """Dynamic sampling's outcome for one step: slot i holds draw `slots[i]` (policy/dynamic.py),
    whose problem is `problems[i]`; `metrics` go into the step's row."""

    slots: list[int]
    problems: list[Problem]
    metrics: dict[str, float]


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
        self.joined: list[int] = []  # reserve devices that joined: rollout instances from then on
        rollout = cfg.rollout
        if emulation is None and isinstance(source, TaskSteps):  # the KV cache sized by the run's prompts
            rollout = dataclasses.replace(rollout, max_context=fitted_context(
                cfg.model, rollout.max_context, source.longest_prompt(), cfg.env.response_tokens(algo.sampling.max_new_tokens)))
        self.spec = WorkerSpec(cfg.model, cfg.data.tokenizer, algo, rollout, cfg.run.seed, c.threads_per_device,
                               cfg.determinism == "bitwise", c.device,
                               emulation.device_spec if emulation is not None else None,
                               c.step_timeout_s, faults.hang_hook(), c.gpus_per_device, c.shard,
                               test_kill=faults.sync_kill_hook())
        if emulation is not None:
            self.ranker, default = emulation.ranker, emulation.dispatcher
        else:  # a real job prices the long tail on the default cost model, with step 0's prompt length
            first = source.problems(0)
            prompt_len = round(sum(len(source.prompt_ids(p)) for p in first) / len(first))
            from poise.model.length_ranker import torch_rankers  # torch: real compute only (issue 14)

            self.ranker, default = build_dispatch(cfg.dispatch, cfg.run.seed, CostModel(), prompt_len,
                                                  algo.group_size, rankers=torch_rankers())
        self.dispatcher = dispatcher or default  # tests inject reordering or lossy ones
        self.emulation_cost = emulation.cost if emulation is not None else None
        # wall seconds per cost-model second: the controller prices in model seconds
        self.time_scale = emulation.device_spec.time_scale if emulation is not None else 1.0
        self.service: StreamGenerationService | None = None
        # a hard resize recreates the actors, so it prewarms only the split it starts
        self.transitions = resize_transitions(cfg, split) if cfg.resize.mode == "live" else []
        self.start(Split(*split), self.transitions)

    def start(self, split: Split, transitions: list[tuple[Split, Split]]) -> None:
        """Place the devices' worker actors in the pool's bundles, in the roles of `split`."""
        c, algo = self.cfg.cluster, self.cfg.algorithm
        port = rendezvous_key()  # device 0 publishes its store's address under it (runtime/worker.py)
        resources = {"num_gpus": c.gpus_per_device} if c.device == "cuda" else {}
        # the thread env of every device process, also on a joined cluster, whose job has none of
        # start_local's runtime_env: the same OpenMP/MKL set-up on every node (issue 11)
        resources["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": str(c.threads_per_device),
                                                 "TOKENIZERS_PARALLELISM": "false"}}
        world = c.devices + c.reserve_devices  # the reserve is in the torch world from the start, idle
        # emulated devices may share a process (runtime/worker.py DeviceHost); real ones never do
        per = self.cfg.emulation.per_process(world) if self.spec.emulated is not None else 1
        pool_rollout = split.rollout - len(self.joined)  # a restart (recovery) keeps the joined devices
        self.rollout_ranks = list(range(pool_rollout)) + self.joined
        self.train_ranks = list(range(pool_rollout, pool_rollout + split.train))
        spec = dataclasses.replace(self.spec, train_ranks=tuple(self.train_ranks))  # shard: full loads its run
        self.workers = start_devices(list(range(c.devices)), self.pool.strategy, per, world, port, spec,
                                     num_cpus=1, **resources)
        if c.reserve_devices:
            self.workers += start_devices(list(range(c.devices, world)), self.reserve.strategy, per, world, port,
                                          spec, num_cpus=1, **resources)
        self.leader = self.train_ranks[0]
        # every worker creates the same groups in the same order (dist.new_group is collective):
        # those of this split and of every split a live resize may move to
        groups = prewarm_rank_sets(split, transitions)
        groups += scale_rank_sets(self.cfg, self.leader, list(range(pool_rollout)))  # and of the joins
        if self.cfg.pipeline.assist and list(range(c.devices)) not in groups:  # train + helping rollout devices
            groups.append(list(range(c.devices)))
        faults.wait([w.prewarm_groups.remote(groups) for w in self.workers], list(range(len(self.workers))),
                    "start-up (model build and communicators)", max(c.step_timeout_s, faults.START_UP_S))
        faults.wait([self.workers[d].set_role.remote("rollout") for d in self.rollout_ranks]
                    + [self.workers[d].set_role.remote("train") for d in self.train_ranks],
                    self.rollout_ranks + self.train_ranks, "start-up", c.step_timeout_s)
        old = self.service
        self.service = StreamGenerationService([self.workers[d] for d in self.rollout_ranks], self.rollout_ranks,
                                               self.dispatcher, self.ranker, algo.group_size,
                                               self.cfg.rollout.num_slots, step_timeout_s=c.step_timeout_s,
                                               **self.lenders())
        if old is not None:  # a hard resize: what the old service knew of samples not yet logged
            self.service.instance_of, self.service.busy = old.instance_of, old.busy
        self.trainer = TrainerGroup([self.workers[d] for d in self.train_ranks], self.train_ranks,
                                    algo.advantage, self.cfg.pipeline.streaming, algo.loss_agg,
                                    step_timeout_s=c.step_timeout_s, rounds=self.full, **self.helpers())

    @property
    def sharded(self) -> bool:
        """`cluster.shard: optimizer | full` on real compute: each train device owns part of the
        optimizer state, so a checkpoint needs every train device and a resize reshards."""
        return self.cfg.cluster.shard != "none" and self.spec.emulated is None

    @property
    def full(self) -> bool:
        """`cluster.shard: full` on real compute: the parameters are sharded too, so a weight sync
        comes from every owner and the weights' digest needs every train device."""
        return self.cfg.cluster.shard == "full" and self.spec.emulated is None

    def sync_senders(self) -> list[int]:
        """The devices a weight sync comes from: the train leader, or every owner (`shard: full`)."""
        return list(self.train_ranks) if self.full else [self.leader]

    def publish_refs(self, version: int, after: list | None) -> list:
        """Queue weights `version` to every rollout device (`publish_weights_refs`), behind `after`."""
        owners = {d: self.workers[d] for d in self.train_ranks} if self.full else None
        return self.service.publish_weights_refs(self.workers[self.leader], self.leader, version,
                                                 self.cfg.rollout.weight_bucket_mb, after, owners)

    def helpers(self) -> dict:
        """`pipeline.assist`: the pool's rollout devices (a joined reserve device is not in the
        prewarmed group of the pool), which compute a share of the training tail."""
        ranks = [d for d in self.rollout_ranks if d not in self.joined] if self.cfg.pipeline.assist else []
        return {"helpers": [self.workers[d] for d in ranks], "helper_ranks": ranks}

    def lenders(self) -> dict:
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
        return Split(len(self.rollout_ranks), len(self.train_ranks))

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


class Driver:
    def __init__(self, cfg: TrainConfig, run_dir: Path, runtime: Runtime, source: StepSource,
                 policy: ResizePolicy | None = None):
        self.cfg, self.run_dir, self.rt, self.source = cfg, run_dir, runtime, source
        self.kind = cfg.pipeline.kind  # sync | stream | async
        # static, a schedule, or the controller
        self.policy = policy if policy is not None else resize_policy(cfg, runtime.emulation_cost)
        self.pending_resize: ResizeReport | None = None  # completed by the first step on the new split
        self.resize_from: tuple[list[int], list[int]] | None = None  # (rollout, train ranks) while a resize runs
        self.resize_wall = (0.0, 0.0)  # run-time start and end of the pending resize
        self.version = 0
        self.start_step = 0
        self.t0 = time.time()
        self.generated: dict[int, list[tuple[Sample, float]]] = {}  # async: the next step, already generated
        self.started: set[int] = set()  # steps whose generation was handed to the rollout devices
        self.reward_results: dict[SampleId, RewardResult] = {}  # per function, until the step is logged
        self.trained: tuple | None = None  # the step's results once its update is done, until published
        self.syncing: list = []  # the step's weight-sync calls, once queued
        self.injector = faults.Injector(runtime.spec.test_kill)  # the fault tests' kills (POISE_TEST_KILL)
        self.recoveries = 0
        self.dynamic: dict[int, DynamicStep] = {}  # dynamic sampling: each generated step's slots, until logged
        self.scale = ScaleOut(cfg, runtime, self.now)  # reserve devices joining as rollout instances
        self.evaluation = RolloutEvaluation.of(cfg, source)  # eval.every: held-out problems between steps
        self.episodes: EpisodeRunner | None = None  # env.name: multi-turn episodes (poise.episodes)
        self.episode_counters: dict[int, dict] = {}  # per generated step, until logged
        if cfg.env.path is not None:
            self.episodes = EpisodeRunner(cfg.env, source.rewards, TurnCodec(source.tokenizer, cfg.data.chat_template),
                                          cfg.algorithm.sampling.max_new_tokens, runtime.spec.rollout.max_context,
                                          cfg.run.seed)

    def now(self) -> float:
        return time.time() - self.t0

    # --- the loop ------------------------------------------------------------------------------
    def run(self, log: RunLog) -> list[dict]:
        cfg, rows = self.cfg, []
        with StepProgress("train", cfg.run.steps, enabled=cfg.run.progress, completed=self.start_step) as bar, \
                interrupt.graceful(self.run_dir):
            for step in range(self.start_step, cfg.run.steps):
                t_start = self.now()
                problems = self.source.problems(step)
                # generate, score, train, publish; after a worker death, again from the phase that broke
                scored, stats, micro, updates, t_gen, t_train, sync_s = self.survive(
                    log, step, "step", lambda: self.train_step(log, step, problems))
                t_end = self.now()
                check_finite(step, stats, self.run_dir)  # a NaN update stops the run before any save
                evals = self.survive(log, step, "eval", lambda: self.evaluation.after_step(self.rt, step, self.version)
                                     ) if self.evaluation is not None else {}  # eval/...: held-out, on rollout devices
                row = self.log_step(log, step, problems, scored, stats, micro, updates,
                                    (t_start, t_gen, t_train, t_end), sync_s, evals)
                rows.append(row)
                stop = interrupt.requested()  # read once: the checkpoint below is the one a stop needs
                self.survive(log, step, "checkpoint", lambda: self.checkpoint(log, step + 1, force=bool(stop)))
                bar.advance(reward=row["reward_mean"], len=row["response_len_mean"], tok_s=row["tokens_per_s"])
                if stop:
                    raise interrupt.Stopped(stop, step + 1, checkpoint_dir(self.run_dir, step + 1))
                self.maybe_resize(log, step, scored, (t_start, t_gen, t_train, t_end))  # the split of step k+1
                self.scale.after_step(log, step, (t_start, t_gen, t_train, t_end), micro, updates, self.version)
        return rows

    def train_step(self, log: RunLog, step: int, problems: list[Problem]):
        """Step `step` up to weights version k+1 on every rollout device. Once its update is done
        (`self.trained`), running it again after a recovery only publishes the weights again."""
        if self.trained is None:
            # expected ids, mini/micro-batches and owners; the weights version its last update makes
            self.rt.trainer.start_step(self.plan(step), self.version + 1)
            if self.kind == "async":  # train on step k (generated last step) while generating k+1
                scored = self.generated.get(step) or self.generate(step, problems)
                self.generated[step] = scored
                ahead = self.source.problems(step + 1) if step + 1 < self.cfg.run.steps else None
                ahead = ahead if step + 1 not in self.generated else None  # a recovery kept it
                if ahead:
                    self.start_generation(step + 1, ahead)  # with weights k, while k trains
                self.rt.trainer.feed(sorted(scored, key=lambda x: x[0].sample_id))
                self.injector.at(self.rt, "train", step)
                if ahead:
                    self.rt.trainer.expect_next(self.plan(step + 1))  # its micro-batches put as they complete
                    self.generated[step + 1] = self.collect(ahead, step=step + 1)
            elif step in self.generated:  # a recovery kept the step's samples: train on them
                scored = self.generated[step]
                self.rt.trainer.feed(sorted(scored, key=lambda x: x[0].sample_id))
            else:  # each sample goes to the trainer the moment it is scored
                scored = self.generated[step] = self.generate(step, problems, stream_to_trainer=True)
            t_gen = self.now()
            if self.kind != "async":
                self.injector.at(self.rt, "train", step)
            syncing = self.syncing = self.rt.publish_weights_refs(self.version + 1)  # queued behind the last update
            self.queue_next_generation(step)  # behind the sync on every rollout device
            stats, micro, updates = self.rt.trainer.finish_step()  # train
            t_train = self.now()
            if self.pending_resize is not None:
                self.log_resize(log, updates)
            self.version += 1
            self.trained = (scored, stats, micro, updates, t_gen, t_train, syncing)
        scored, stats, micro, updates, t_gen, t_train, syncing = self.trained
        if syncing is None:  # a recovery after the update: the weights go out again
            ahead = step + 1 < self.cfg.run.steps and step + 1 not in self.generated
            if self.kind == "async" and ahead:  # first the next step's samples, with the weights before it
                problems_ahead = self.source.problems(step + 1)
                self.start_generation(step + 1, problems_ahead)
                self.generated[step + 1] = self.collect(problems_ahead, step=step + 1)
            syncing = self.rt.publish_refs(self.version, None)
            self.queue_next_generation(step)
        self.injector.at(self.rt, "publish", step)
        sync_s = self.publish(log, step, syncing)  # weights version k+1 on every rollout device
        self.trained = None
        self.generated.pop(step, None)
        return scored, stats, micro, updates, t_gen, t_train, sync_s

    def survive(self, log: RunLog, step: int, phase: str, run):
        """`run()` phase `phase` of step `step`; if a worker dies in it, recover (runtime/faults.py)
        and run it again."""
        while True:
            try:
                return run()
            except faults.WorkerLost as e:
                lost = e
            except (RayActorError, RayTaskError) as e:  # a survivor's call failed: did an actor die?
                lost = faults.lost_or_raise(self.rt, e, [], f"step {step}")
                if not isinstance(lost, faults.WorkerLost):
                    raise
            self.recover(log, step, phase, lost)

    def recover(self, log: RunLog, step: int, phase: str, lost: faults.WorkerLost) -> None:
        """Replace the dead actors and restore a surviving replica's state on every device."""
        detected = time.time()
        c = self.cfg.cluster
        self.recoveries += 1
        if self.recoveries > c.max_recoveries:
            raise faults.RunFailure(faults.unrecoverable(self.rt, lost.devices, step, self.run_dir,
                                                         f"cluster.max_recoveries={c.max_recoveries} are spent"))
        if self.rt.emulation_cost is not None:
            raise faults.RunFailure(faults.unrecoverable(self.rt, lost.devices, step, self.run_dir,
                                                         "emulated devices hold no state to restore from"))
        rollout_version = self.version  # what generation in flight was made with
        if phase == "resize" and self.resize_from is not None:
            # a resize half done: its joiners may not hold the optimizer state yet. The devices are
            # replaced on the split before it, from one of its train devices, and it runs again
            self.rt.rollout_ranks, self.rt.train_ranks = self.resize_from
            self.rt.leader = self.rt.train_ranks[0]
        if phase == "step" and self.trained is None:
            done = faults.settled_updates(self.rt.trainer, c.step_timeout_s)
            if done == "some":
                raise faults.RunFailure(faults.unrecoverable(
                    self.rt, lost.devices, step, self.run_dir, "some of its updates had already happened"))
            if done == "all":  # async: the update ended on every train device, the next step's generation broke
                stats, micro, updates = self.rt.trainer.finish_step()
                self.version += 1
                self.trained = (self.generated[step], stats, micro, updates, self.now(), self.now(), None)
        phase = "publish" if self.trained is not None else phase
        broken = faults.step_refs(self.rt.trainer) + self.syncing + list((self.trained or [None])[-1] or [])
        source, what, silent = faults.recover(self.rt, lost, step, self.version, rollout_version, self.run_dir,
                                      c.step_timeout_s)
        faults.drain(broken)  # the dead step's failed calls: read here, not printed by Ray as unhandled
        if self.trained is not None:  # publish again (train_step): the rollout devices hold the weights they
            self.trained = self.trained[:-1] + (None,)  # generated with, which an async step may still need
        self.started = set(self.generated)  # what the dead actors were generating starts again
        killed = self.injector.kill_time()
        log.event("recovery", self.now(), step=step, phase=phase, devices=lost.devices, source=source,
                  detect_s=(detected - killed) if killed else None, recover_s=time.time() - detected, silent=silent,
                  **({"killed": self.injector.where} if self.injector.where else {}))
        print(f"poise: warning: {what}", file=sys.stderr)

    def restore_pending(self, checkpoint: Path) -> None:
        """An async resume: the resumed step's samples were made with the weights one version
        before the checkpoint's (exact staleness 1), which no device holds any more: the
        checkpoint kept the samples themselves. They are scored again (rewards are a function of
        the sample) and trained on as if just generated."""
        step, path = self.start_step, checkpoint / PENDING_SAMPLES
        if self.kind != "async" or step >= self.cfg.run.steps or step == 0:
            return
        if not path.is_file():
            raise PoiseError(f"checkpoint '{checkpoint}' has no {PENDING_SAMPLES} (a sync or colocated run, or one "
                             "from before async resume): resume it with pipeline.mode=sync or colocated")
        pending = decode_samples(path)
        problems = self.source.problems(step)
        if self.cfg.algorithm.dynamic_sampling:  # slot i holds draw slots[i]: its problem scores it
            saved = json.loads((checkpoint / DYNAMIC_DRAWS).read_text())
            problems = self.source.draws(step, saved["slots"])
            self.dynamic[step] = DynamicStep(saved["slots"], problems, saved["metrics"])
        samples = [s for s, _ in pending]
        results = self.source.submit_scores(problems, samples).result()
        self.reward_results.update((s.sample_id, r) for s, r in zip(samples, results))
        self.rt.service.instance_of.update((s.sample_id, d) for s, d in pending)
        self.generated[step] = [(s, r.value) for s, r in zip(samples, results)]
        self.started.add(step)

    # --- phases --------------------------------------------------------------------------------
    def plan(self, step: int) -> StepPlan:
        a = self.cfg.algorithm
        return plan_step(step, a.prompts_per_step, a.group_size, updates_per_step=a.updates_per_step,
                         micro_batch_size=a.micro_batch_size, train_devices=len(self.rt.train_ranks), mode=self.kind)

    def generate(self, step: int, problems: list[Problem], stream_to_trainer: bool = False
                 ) -> list[tuple[Sample, float]]:
        self.start_generation(step, problems)
        return self.collect(problems, stream_to_trainer, step=step)

    def start_generation(self, step: int, problems: list[Problem]) -> None:
        """Dispatch step `step`'s prompt groups over the rollout instances (once per step)."""
        if step in self.started:
            return
        self.started.add(step)
        prompt_ids = [self.source.prompt_ids(p) for p in problems]
        first_turns = None
        if self.episodes is not None:  # each episode's first turn, once its environment has reset
            first_turns = self.episodes.first_turns(step, problems, prompt_ids, self.cfg.algorithm.group_size,
                                                    self.version)
        self.rt.service.start_step(step, problems, prompt_ids, first_turns)

    def queue_next_generation(self, step: int) -> None:
        """Hand the rollout devices the next generation's queues now, right behind the weight sync
        just queued: each actor runs its calls in order, so an engine starts on them the moment its
        weights arrive, not a driver round trip (logging, checkpoint, planning) later. The next
        generation is step k+1 in sync, k+2 in async (k+1 was generated during this step)."""
        nxt = step + (2 if self.kind == "async" else 1)
        if nxt < self.cfg.run.steps and self.episodes is None:  # episodes start with their step's collect
            try:
                self.start_generation(nxt, self.source.problems(nxt))
            except Exception:  # noqa: BLE001 - not lost: step `nxt` plans again and raises it there,
                self.started.discard(nxt)  # after this step is logged and checkpointed

    def collect(self, problems: list[Problem], stream_to_trainer: bool = False, step: int = -1
                ) -> list[tuple[Sample, float]]:
        """Score every sample of the step in generation as its batch arrives (and train on it).
        Each arrived batch goes to the reward sandbox at once; batches are taken back in arrival
        order as they are scored (a fast reward within SCORE_WAIT_S), so slow rewards overlap the
        generation and arrival of the next batches."""
        if self.cfg.algorithm.dynamic_sampling:
            return self.collect_dynamic(problems, stream_to_trainer, step)
        if self.episodes is not None:
            return self.collect_episodes(problems, stream_to_trainer, step)
        scored: list[tuple[Sample, float]] = []
        pending: list[tuple[list[Sample], PendingRewards]] = []
        for batch in self.rt.service.stream():
            self.injector.at(self.rt, "generate", step)  # the fault tests: samples are in flight now
            pending.append((batch, self.source.submit_scores(problems, batch)))
            pending[-1][1].done(wait_s=SCORE_WAIT_S)
            while pending and pending[0][1].done():
                scored += self.take_scored(*pending.pop(0), stream_to_trainer)
        for batch, rewards in pending:
            scored += self.take_scored(batch, rewards, stream_to_trainer)
        self.rt.service.observe([s for s, _ in scored])
        return scored

    def collect_episodes(self, problems: list[Problem], stream_to_trainer: bool, step: int
                         ) -> list[tuple[Sample, float]]:
        """`collect` for multi-turn episodes: each finished turn goes to its environment at once (in
        the reward sandbox) while the rollout devices decode other turns; an environment's answer
        hands the next turn to a rollout instance (`submit_turns`); an episode that ends is scored (the reward
        functions on its last turn plus its environment's rewards) and goes on (to the trainer)."""
        runner, scored = self.episodes, []
        pending: list[tuple[list[Sample], PendingRewards]] = []

        def hand_out(wait_s: float) -> None:
            requests, finished = runner.poll(wait_s)
            if requests:
                self.rt.service.submit_turns(requests)
            if finished:
                pending.append((finished, self.source.submit_scores(problems, finished)))
            while pending and pending[0][1].done():
                scored.extend(self.take_episodes(*pending.pop(0), stream_to_trainer))

        while runner.active:
            for batch in self.rt.service.stream(heartbeat=True):
                if batch:
                    self.injector.at(self.rt, "generate", step)
                    runner.turns_done(batch, [self.rt.service.instance_of[s.sample_id] for s in batch])
                hand_out(0.0)
            if runner.active:  # nothing generating: every live episode waits for its environment
                hand_out(SCORE_WAIT_S)
        for batch, rewards in pending:
            scored += self.take_episodes(batch, rewards, stream_to_trainer)
        self.rt.service.observe([s for s, _ in scored])
        self.episode_counters[step] = runner.take_step_counters()  # this generation's (in async: step k+1's)
        return scored

    def take_episodes(self, batch: list[Sample], rewards: PendingRewards, stream_to_trainer: bool
                      ) -> list[tuple[Sample, float]]:
        results = with_env_rewards(dict(zip((s.sample_id for s in batch), rewards.result())), self.episodes.stats)
        self.reward_results.update(results)
        part = [(s, self.shaped(s, results[s.sample_id].value)) for s in batch]
        self.hand_on(part, stream_to_trainer)
        return part

    def collect_dynamic(self, problems: list[Problem], stream_to_trainer: bool, step: int
                        ) -> list[tuple[Sample, float]]:
        """`collect` with dynamic sampling (policy/dynamic.py): a group whose rewards are all equal
        is dropped once scored and a new draw goes to the instances at once; each slot's group,
        relabelled (step, slot, j), goes on (to the trainer) once every draw before it is resolved."""
        a = self.cfg.algorithm
        resolver = DrawResolver(a.prompts_per_step, a.group_size, default_max_draws(a.prompts_per_step,
                                                                                     a.max_prompt_draws))
        resolver.start()  # the step's own prompts: dispatched by start_generation
        by_draw: dict[int, Problem] = dict(enumerate(problems))
        drawn: dict[SampleId, tuple[Sample, RewardResult, float]] = {}
        scored: list[tuple[Sample, float]] = []

        def take(batch: list[Sample], rewards: PendingRewards) -> None:
            launch: list[int] = []
            for s, r in zip(batch, rewards.result()):
                value = self.shaped(s, r.value)
                drawn[s.sample_id] = (s, r, value)
                launch += resolver.scored(s.sample_id, value)
            if launch:  # the dropped groups' replacements start now, whatever else is in flight
                new = self.source.draws(step, launch)
                by_draw.update(zip(launch, new))
                self.rt.service.extend(step, new, [self.source.prompt_ids(p) for p in new], launch)
            part = []
            for slot, draw in resolver.assign():
                for j in range(a.group_size):
                    s, r, value = drawn[(step, draw, j)]
                    sample = dataclasses.replace(s, sample_id=(step, slot, j))
                    self.rt.service.instance_of[sample.sample_id] = self.rt.service.instance_of[s.sample_id]
                    self.reward_results[sample.sample_id] = r
                    part.append((sample, value))
            self.hand_on(part, stream_to_trainer)
            scored.extend(part)

        while not resolver.done:
            pending: list[tuple[list[Sample], PendingRewards]] = []
            for batch in self.rt.service.stream():
                self.injector.at(self.rt, "generate", step)
                pending.append((batch, self.source.submit_scores(by_draw, batch)))
                pending[-1][1].done(wait_s=SCORE_WAIT_S)
                while pending and pending[0][1].done():
                    take(*pending.pop(0))
            launched = resolver.launched
            for batch, rewards in pending:
                take(batch, rewards)
            if not resolver.done and resolver.launched == launched:
                raise RuntimeError(f"step {step}: dynamic sampling stalled with {len(resolver.slots)} of "
                                   f"{a.prompts_per_step} slots fixed and nothing in flight")
        self.rt.service.observe([s for s, _, _ in drawn.values()])
        generated = [value for _, _, value in drawn.values()]
        self.dynamic[step] = DynamicStep(list(resolver.slots), [by_draw[d] for d in resolver.slots],
                                         {**resolver.metrics(),
                                          "dynamic/reward_mean_generated": sum(generated) / len(generated)})
        return scored

    def shaped(self, sample: Sample, reward: float) -> float:
        """The reward the algorithm sees: the reward functions' plus overlong shaping (algo/shaping.py)."""
        a = self.cfg.algorithm
        return reward + overlong_penalty(trained_tokens(sample), a.sampling.max_new_tokens, a.overlong_buffer,
                                         a.overlong_penalty)

    def take_scored(self, batch: list[Sample], rewards: PendingRewards, stream_to_trainer: bool
                    ) -> list[tuple[Sample, float]]:
        results = rewards.result()
        self.reward_results.update((s.sample_id, r) for s, r in zip(batch, results))
        part = [(s, self.shaped(s, r.value)) for s, r in zip(batch, results)]
        self.hand_on(part, stream_to_trainer)
        return part

    def hand_on(self, part: list[tuple[Sample, float]], stream_to_trainer: bool) -> None:
        """Scored samples go to the trainer (streaming), or, in async, ahead into the object store."""
        if stream_to_trainer:
            self.rt.trainer.feed(part)
        elif self.kind == "async":
            self.rt.trainer.arrive_ahead([s for s, _ in part])

    def publish(self, log: RunLog, step: int, syncing: list) -> float:
        """Wait for weights version `self.version` to reach every rollout device."""
        senders = self.rt.sync_senders()
        seconds = max(faults.wait(syncing, [*senders, *self.rt.rollout_ranks], f"weight sync of step {step}",
                                  self.cfg.cluster.step_timeout_s), default=0.0)
        if self.cfg.run.verify_sync:
            leader, rollout = self.rt.digests()
            reported = dict(zip(self.rt.rollout_ranks, rollout, strict=True))  # a missing answer is an error
            for device, digest in reported.items():
                if digest != leader:
                    raise PoiseError(f"weight sync of version {self.version}: rollout device {device} holds weights "
                                     f"{digest[:12]} but the trainer holds {leader[:12]}; the sync lost or "
                                     "corrupted a bucket")
            log.event("sync", self.now(), step=step, version=self.version, digest=leader,
                      devices=[self.rt.leader, *self.rt.rollout_ranks],
                      rollout_digests={str(d): digest for d, digest in reported.items()})
        return seconds

    def maybe_resize(self, log: RunLog, step: int, scored, times: tuple[float, float, float, float]) -> None:
        """Once per step the resize policy decides (every decision is logged); a resize happens
        here, live, between this step's weight sync and the next step's first update."""
        if step + 1 >= self.cfg.run.steps:
            return
        t_start, t_gen, t_train, t_end = times
        if self.pending_resize is not None and isinstance(self.policy, ResizeController):
            return  # this step absorbed a resize: nothing to calibrate on (and in cooldown)
        lengths = tuple(len(s.token_ids) for s, _ in scored)
        k = 1.0 / self.rt.time_scale  # emulated compute: wall seconds -> the cost model's seconds
        obs = StepObservation(step, k * t_end, self.rt.split, k * (t_gen - t_start), k * (t_train - t_gen),
                              k * (t_end - t_start), lengths,
                              round(sum(len(s.prompt_ids) for s, _ in scored) / max(1, len(scored))),
                              sync_s=k * (t_end - t_train))
        decision = self.policy.observe(obs)
        log.event("decision", t_end, **decision.event_fields())
        if decision.action != "resize":
            return
        start = self.now()
        self.resize_from = (list(self.rt.rollout_ranks), list(self.rt.train_ranks))
        report, devices = self.survive(log, step, "resize", lambda: self.resize(decision.to_split, step))
        self.resize_from = None
        self.pending_resize, self.resize_wall = report, (start, self.now())
        t = start
        for phase, seconds in report.phases.items():  # on the switching devices' rows, one after another
            for device in devices:
                log.event("interval", t, device=device, role="resize", phase=phase, step=step, start=t,
                          end=t + seconds)
            t += seconds

    def resize(self, to: Split, step: int) -> tuple[ResizeReport, list[int]]:
        """Move to split `to` after step `step` (live, or the hard baseline); the report and the
        devices whose rows show it. After a recovery (the devices back on the split before the
        resize, runtime/faults.py) it runs again from the start."""
        self.injector.at(self.rt, "resize", step)  # the fault tests: a death as the resize starts
        if self.cfg.resize.mode == "hard":  # the baseline: stop, checkpoint, rebuild, reload
            report = hard_resize(self.rt, to, self.version, step, self.run_dir)
            self.started.discard(step + (2 if self.kind == "async" else 1))  # its generation starts again
            return report, list(range(self.cfg.cluster.devices))  # every device stops
        report = live_resize(self.rt, to, self.version, step, self.cfg.resize.staging_mb)
        return report, report.to_train + report.to_rollout

    def log_resize(self, log: RunLog, updates: list[dict]) -> None:
        """The `resize` event of the last resize, once its first step showed the barrier wait."""
        report = finish_report(self.rt, self.pending_resize, updates)
        start, end = self.resize_wall
        log.event("resize", start, start=start, end=end, **report.event_fields())
        if self.cfg.cluster.compute == "real":
            # its next break-even check prices the resize this job measured. Not under emulated
            # compute: there the scenario's price stands, as in the simulator, whose decisions the
            # emulated run reproduces (its switching devices sleep only Poise's own phases)
            self.policy.resized(report.critical_path_s)
        self.pending_resize = None

    def checkpoint(self, log: RunLog, done: int, force: bool = False) -> None:
        """After `done` steps: every run.checkpoint_every, at the end, and when a signal stops the run."""
        run = self.cfg.run
        if force or done == run.steps or (run.checkpoint_every and done % run.checkpoint_every == 0):
            log.flush()  # the events of the steps this checkpoint covers are on disk before it is
            self.injector.at(self.rt, "checkpoint", done - 1)
            extra = None
            if done in self.generated:  # async: step `done`'s samples, made with the weights before this update
                extra = {PENDING_SAMPLES: encode_samples([s for s, _ in self.generated[done]],
                                                         self.rt.service.instance_of)}
                if done in self.dynamic:
                    d = self.dynamic[done]
                    extra[DYNAMIC_DRAWS] = json.dumps({"slots": d.slots, "metrics": d.metrics}).encode()
            prune_before_save(self.run_dir, run.keep_checkpoints, done)  # room first: the disk may be full
            # the driver's run.dir: written there by the leader, or through the driver (runtime/storage.py)
            self.rt.store.save(self.rt.leader, self.rt.workers[self.rt.leader], self.run_dir, done, self.version,
                               extra, f"the checkpoint after step {done - 1}")
            prune_checkpoints(self.run_dir, run.keep_checkpoints)

    # --- the log -------------------------------------------------------------------------------
    def log_step(self, log: RunLog, step: int, problems: list[Problem], scored, stats: dict, micro: list[dict],
                 updates: list[dict], times: tuple[float, float, float, float], sync_s: float,
                 evals: dict | None = None) -> dict:
        """Events and the metrics row of step `step`: its own samples (each with its own finish time
        and instance), its generation intervals (in async, run during the step before) and its
        training intervals."""
        t_start, t_gen, t_train, t_end = times
        dynamic = self.dynamic.pop(step, None)
        problems = dynamic.problems if dynamic is not None else problems  # slot i's problem
        ordered = sorted(scored, key=lambda x: x[0].sample_id)
        samples = [s for s, _ in ordered]
        rewards: dict[SampleId, float] = {s.sample_id: r for s, r in ordered}
        row = step_metrics(step, samples, rewards, problems, stats,
                           {"rollout_s": t_gen - t_start, "train_wait_s": t_train - t_gen, "sync_s": t_end - t_train})
        row["split"] = self.rt.split.as_list()
        row.update(dynamic.metrics if dynamic is not None else {})
        if self.cfg.algorithm.overlong_buffer:
            row["reward/overlong"] = sum(self.shaped(s, 0.0) for s in samples) / len(samples)
        results = [(s.sample_id, self.reward_results.pop(s.sample_id)) for s in samples]
        row.update(reward_metrics(r for _, r in results))  # reward/<function> means, reward_failures
        if self.episodes is not None:  # turns, model and observation tokens, environment time and failures
            row.update(episode_metrics([self.episodes.stats.pop(s.sample_id) for s in samples],
                                       self.episode_counters.pop(step, None)))
        log_failures(log, t_gen, step, results, self.cfg.reward.fallback)
        rel = lambda wall: wall - self.t0  # noqa: E731 - workers report wall-clock times
        for device, start, end in self.rt.service.busy.get(step, []):
            log.event("interval", rel(start), device=device, role="rollout", phase="generate", step=step,
                      start=rel(start), end=rel(end))
        for m in micro:
            log.event("interval", rel(m["start"]), device=m["device"], role="train", phase="micro_batch",
                      step=step, start=rel(m["start"]), end=rel(m["end"]), micro_batch=m["index"],
                      **({"held_grads": m["held_grads"]} if "held_grads" in m else {}))
        for u in updates:  # real compute reports the reduction's traffic
            traffic = {k: u[k] for k in ("received_bytes", "grad_bytes", "weight_bytes", "optimizer_bytes",
                                         "parameter_bytes") if k in u}
            log.event("interval", rel(u["start"]), device=u["device"], role="train", phase="update",
                      step=step, start=rel(u["start"]), end=rel(u["end"]), **traffic)
        tokens = self.cfg.run.log_tokens
        for s in samples:
            log.event("sample", rel(s.finish_time), id=list(s.sample_id), step=step,
                      prompt_id=problems[s.sample_id[1]].uid, output_length=len(s.token_ids),
                      weights_version=s.weights_version, instance=self.rt.service.instance_of[s.sample_id],
                      submit=rel(s.submit_time), finish=rel(s.finish_time), reward=rewards[s.sample_id],
                      **({"draw": dynamic.slots[s.sample_id[1]]} if dynamic is not None else {}),
                      **({"tokens": list(s.token_ids), "logprobs": list(s.logprobs)} if tokens else {}),
                      **episode_event_fields(s, tokens))
        self.rt.service.forget(step)
        log.event("step", t_end, step=step, start=t_start, end=t_end, rollout_s=t_gen - t_start,
                  train_s=t_train - t_gen, sync_s=sync_s, reward_mean=row["reward_mean"],
                  tokens=row["tokens"], split=row["split"], mode=self.cfg.pipeline.mode)
        row.update(evals or {})  # eval/...: the held-out metrics of this step's weights
        log.metrics(row)
        return row


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


def train_disaggregated(cfg: TrainConfig, resume: bool = False, dispatcher=None) -> list[dict]:
    if resume and cfg.scale.active:  # the joined devices are not in a checkpoint
        raise PoiseError("--resume with scale.schedule or scale.policy=controller is not supported yet; resume with "
                         "scale.policy=static (the same trajectory, on the pool without the joined devices)")
    run_dir = prepare_run_dir(cfg, resume)
    # everything that can be wrong with the input fails here, before Ray starts
    make_tokenizer(cfg.data, cfg.model)
    make_prompt_source(cfg.data, cfg.run.seed)
    resolve_functions(cfg.reward)
    emulation = None
    if cfg.cluster.compute == "emulated":  # no model anywhere: no warm start, nothing to load
        from poise.runtime.emulated import Emulation

        emulation = Emulation.from_config(cfg, resume)  # a bad scenario fails here, before Ray starts
        cfg = emulation.cfg  # prompts per step and group size are the scenario workload's
    else:
        _prepare_model(cfg)
        if cfg.model.dtype != "float32":  # one line where this CPU would emulate it
            from poise.training.setup import compute_dtype

            compute_dtype(cfg.model.dtype, cfg.cluster.device)
    checkpoint = latest_checkpoint(run_dir) if resume else None
    rewards = RewardScorer(cfg.reward, cfg.env) if emulation is None else None  # the reward sandbox: user code loads there
    try:  # from here on a failure, even while starting, stops what started (a notebook keeps no leftovers)
        source: StepSource = emulation if emulation is not None else \
            TaskSteps(cfg.data, cfg.model, cfg.run.seed, cfg.algorithm.prompts_per_step, rewards)
        split = emulation.split() if emulation is not None else choose_split(cfg, source)
        if not resume:
            dump(cfg, run_dir / "config.yaml")
        policy = resize_policy(cfg, emulation.cost if emulation is not None else None)  # a bad profile fails here
        runtime = Runtime(cfg, split, source, dispatcher, emulation, run_dir)  # releases what it held if it fails
        try:
            return _run(cfg, run_dir, runtime, source, policy, checkpoint)
        finally:
            runtime.shutdown()
    finally:
        if rewards is not None:
            rewards.close()  # the reward sandbox's workers end with the run


def _run(cfg: TrainConfig, run_dir: Path, runtime: Runtime, source: StepSource, policy: ResizePolicy,
         checkpoint: Path | None) -> list[dict]:
    """The driver loop on a started runtime, from `checkpoint` when resuming."""
    driver = Driver(cfg, run_dir, runtime, source, policy)
    if checkpoint is not None:
        # every device, rollout or train, restores the same weights (and optimizer state)
        states = faults.wait([w.load_checkpoint.remote(runtime.store.readable(d, w, checkpoint),
                                                       runtime.train_ranks)
                              for d, w in enumerate(runtime.workers)],
                             list(range(len(runtime.workers))), "loading the checkpoint",
                             cfg.cluster.step_timeout_s)
        runtime.store.release()
        driver.start_step, driver.version = states[0]
        driver.restore_pending(checkpoint)
        truncate_logs(run_dir, driver.start_step)  # no step logged twice
        driver.t0 = time.time() - run_clock(run_dir)  # the clock goes on from the last segment's end
        print(resume_line(run_dir, checkpoint, driver.start_step), file=sys.stderr)
    with RunLog(run_dir, append=checkpoint is not None, background=True, tensorboard=cfg.run.tensorboard,
                wandb=cfg.run.wandb, config=to_dict(cfg)) as log:
        return driver.run(log)


def _prepare_model(cfg: TrainConfig) -> None:
    from poise.model.loading import load_model

    m = cfg.model
    if m.path is None:
        return
    if m.sft_if_missing and not Path(m.path, "config.json").is_file():
        from poise.training.sft import run_sft

        run_sft(m, cfg.data, Path(m.path), progress=cfg.run.progress)
    load_model(m.path, device="meta")  # a missing or broken checkpoint fails here with one line, reading no weights
