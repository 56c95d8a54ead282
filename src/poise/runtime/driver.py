"""The disaggregated driver loop: `pipeline.mode` sync or async over one device pool.

sync   step k: generate with weights k, stream each sample to the trainer, update -> k+1, publish.
async  step k: the trainer updates on step k's samples (made with weights k-1) while rollout
       generates step k+1 with weights k; then weights k+1 are published. Exact staleness 1
       (DESIGN.md invariant 4); step 0 uses the initial weights, the only ones there are.

Prompts, sampling, the step plan (poise.policy.plan) and the reduction order are those of the
colocated loop, so in `determinism: bitwise` every sample and every update equals the colocated
reference's. Prompts and rewards come from a `StepSource`: the tasks (real compute) or a
scenario (emulated compute); the driver does not know which.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol, Sequence

import ray

from poise.config import TrainConfig
from poise.data.prompts import TaskSteps, make_prompt_source, make_tokenizer
from poise.data.tasks import Problem
from poise.errors import PoiseError
from poise.metrics import step_metrics
from poise.policy.controller import ResizeController, ResizePolicy, StepObservation, make_resize_policy
from poise.policy.cost import CostModel
from poise.policy.dispatch import build_dispatch
from poise.policy.plan import StepPlan, plan_step
from poise.policy.split import Split
from poise.rewards.functions import resolve_functions
from poise.rewards.scorer import PendingRewards, RewardResult, RewardScorer, log_failures, reward_metrics
from poise.rundir import prepare_run_dir, truncate_logs
from poise.runlog import RunLog
from poise.runtime.cluster import connect, device_pool, free_port
from poise.runtime.resize import ResizeReport, finish_report, hard_resize, live_resize, prewarm_rank_sets
from poise.runtime.service import StreamGenerationService
from poise.runtime.trainer_group import TrainerGroup
from poise.runtime.worker import DeviceWorker, WorkerSpec
from poise.schema import dump
from poise.train.checkpoint import latest_checkpoint, prune_checkpoints
from poise.train.progress import StepProgress
from poise.types import Sample, SampleId

SCORE_WAIT_S = 0.02  # how long the driver waits for a just-arrived batch's rewards before taking the next batch


class StepSource(Protocol):
    """Each step's prompts, their token ids, and each sample's reward (data.prompts.TaskSteps,
    runtime.emulated.Emulation)."""

    def problems(self, step: int) -> list[Problem]: ...

    def prompt_ids(self, problem: Problem) -> Sequence[int]: ...

    def submit_scores(self, problems: list[Problem], samples: list[Sample]) -> PendingRewards:
        """The samples' rewards, computed in the background (the reward sandbox) or already known."""
        ...


class Runtime:
    """The job's devices, roles, communicators, and the two services over them."""

    def __init__(self, cfg: TrainConfig, split: tuple[int, int], source: StepSource, dispatcher=None,
                 emulation=None):
        self.cfg = cfg
        c, algo = cfg.cluster, cfg.algorithm
        connect(c)
        self.pool = device_pool(c)
        self.spec = WorkerSpec(cfg.model, cfg.data.tokenizer, algo, cfg.rollout, cfg.run.seed, c.threads_per_device,
                               cfg.determinism == "bitwise", c.device,
                               emulation.device_spec if emulation is not None else None)
        if emulation is not None:
            self.ranker, default = emulation.ranker, emulation.dispatcher
        else:  # a real job prices the long tail on the default cost model, with step 0's prompt length
            first = source.problems(0)
            prompt_len = round(sum(len(source.prompt_ids(p)) for p in first) / len(first))
            self.ranker, default = build_dispatch(cfg.dispatch, cfg.run.seed, CostModel(), prompt_len,
                                                  algo.group_size)
        self.dispatcher = dispatcher or default  # tests inject reordering or lossy ones
        self.emulation_cost = emulation.cost if emulation is not None else None
        # wall seconds per cost-model second: the controller prices in model seconds
        self.time_scale = emulation.device_spec.time_scale if emulation is not None else 1.0
        self.service: StreamGenerationService | None = None
        # a hard resize recreates the actors, so it prewarms only the split it starts
        transitions = resize_transitions(cfg, split) if cfg.resize.mode == "live" else []
        self.start(Split(*split), transitions)

    def start(self, split: Split, transitions: list[tuple[Split, Split]]) -> None:
        """Place one worker actor per device in the pool's bundles, in the roles of `split`."""
        c, algo = self.cfg.cluster, self.cfg.algorithm
        port = free_port()
        resources = {"num_gpus": 1} if c.device == "cuda" else {}
        self.workers = [DeviceWorker.options(scheduling_strategy=self.pool.strategy(d), num_cpus=1, **resources)
                        .remote(d, c.devices, port, self.spec) for d in range(c.devices)]
        self.rollout_ranks = list(range(split.rollout))
        self.train_ranks = list(range(split.rollout, split.rollout + split.train))
        self.leader = self.train_ranks[0]
        # every worker creates the same groups in the same order (dist.new_group is collective):
        # those of this split and of every split a live resize may move to
        ray.get([w.prewarm_groups.remote(prewarm_rank_sets(split, transitions)) for w in self.workers])
        ray.get([self.workers[d].set_role.remote("rollout") for d in self.rollout_ranks]
                + [self.workers[d].set_role.remote("train") for d in self.train_ranks])
        old = self.service
        self.service = StreamGenerationService([self.workers[d] for d in self.rollout_ranks], self.rollout_ranks,
                                               self.dispatcher, self.ranker, algo.group_size,
                                               self.cfg.rollout.num_slots)
        if old is not None:  # a hard resize: what the old service knew of samples not yet logged
            self.service.instance_of, self.service.busy = old.instance_of, old.busy
        self.trainer = TrainerGroup([self.workers[d] for d in self.train_ranks], self.train_ranks,
                                    algo.scale_rewards, self.cfg.pipeline.streaming, algo.loss_agg)

    def stop(self) -> None:
        """Shut every worker down and kill its actor (the placement group stays)."""
        ray.get([w.shutdown.remote() for w in self.workers])
        for w in self.workers:
            ray.kill(w)

    @property
    def split(self) -> Split:
        return Split(len(self.rollout_ranks), len(self.train_ranks))

    def publish_weights_refs(self, version: int) -> list:
        """Queue weights `version` from the train leader to every rollout device behind the step's
        last update (generation is over: the rollout devices are free to receive)."""
        return self.service.publish_weights_refs(self.workers[self.leader], self.leader, version,
                                                 self.cfg.rollout.weight_bucket_mb, [self.trainer.last_update_ref()])

    def digests(self) -> tuple[str, list[str]]:
        """The train leader's weights digest and every rollout device's."""
        digests = ray.get([self.workers[d].weights_digest.remote() for d in [self.leader] + self.rollout_ranks])
        return digests[0], digests[1:]

    def shutdown(self) -> None:
        self.stop()
        self.pool.release()


class Driver:
    def __init__(self, cfg: TrainConfig, run_dir: Path, runtime: Runtime, source: StepSource,
                 policy: ResizePolicy | None = None):
        self.cfg, self.run_dir, self.rt, self.source = cfg, run_dir, runtime, source
        self.kind = cfg.pipeline.kind  # sync | stream | async
        # static, a schedule, or the controller
        self.policy = policy if policy is not None else resize_policy(cfg, runtime.emulation_cost)
        self.pending_resize: ResizeReport | None = None  # completed by the first step on the new split
        self.resize_wall = (0.0, 0.0)  # run-time start and end of the pending resize
        self.version = 0
        self.start_step = 0
        self.t0 = time.time()
        self.generated: dict[int, list[tuple[Sample, float]]] = {}  # async: the next step, already generated
        self.started: set[int] = set()  # steps whose generation was handed to the rollout devices
        self.reward_results: dict[SampleId, RewardResult] = {}  # per function, until the step is logged

    def now(self) -> float:
        return time.time() - self.t0

    # --- the loop ------------------------------------------------------------------------------
    def run(self, log: RunLog) -> list[dict]:
        cfg, rows = self.cfg, []
        with StepProgress("train", cfg.run.steps, enabled=cfg.run.progress, completed=self.start_step) as bar:
            for step in range(self.start_step, cfg.run.steps):
                t_start = self.now()
                plan = self.plan(step)  # expected ids, mini/micro-batches and owners, weights version
                problems = self.source.problems(step)
                self.rt.trainer.start_step(plan)
                if self.kind == "async":  # train on step k (generated last step) while generating k+1
                    scored = self.generated.pop(step, None) or self.generate(step, problems)
                    ahead = self.source.problems(step + 1) if step + 1 < cfg.run.steps else None
                    if ahead:
                        self.start_generation(step + 1, ahead)  # with weights k, while k trains
                    self.rt.trainer.feed(sorted(scored, key=lambda x: x[0].sample_id))
                    if ahead:
                        self.generated[step + 1] = self.collect(ahead)
                else:  # each sample goes to the trainer the moment it is scored
                    scored = self.generate(step, problems, stream_to_trainer=True)
                t_gen = self.now()
                syncing = self.rt.publish_weights_refs(self.version + 1)  # queued behind the last update
                self.queue_next_generation(step)  # behind the sync on every rollout device
                stats, micro, updates = self.rt.trainer.finish_step()  # train
                t_train = self.now()
                if self.pending_resize is not None:
                    self.log_resize(log, updates)
                self.version += 1
                sync_s = self.publish(log, step, syncing)  # weights version k+1 on every rollout device
                t_end = self.now()
                row = self.log_step(log, step, problems, scored, stats, micro, updates,
                                    (t_start, t_gen, t_train, t_end), sync_s)
                rows.append(row)
                self.checkpoint(log, step + 1)
                self.maybe_resize(log, step, scored, (t_start, t_gen, t_train, t_end))  # the split of step k+1
                bar.advance(reward=row["reward_mean"], len=row["response_len_mean"], tok_s=row["tokens_per_s"])
        return rows

    # --- phases --------------------------------------------------------------------------------
    def plan(self, step: int) -> StepPlan:
        a = self.cfg.algorithm
        return plan_step(step, a.prompts_per_step, a.group_size, updates_per_step=a.updates_per_step,
                         micro_batch_size=a.micro_batch_size, train_devices=len(self.rt.train_ranks), mode=self.kind)

    def generate(self, step: int, problems: list[Problem], stream_to_trainer: bool = False
                 ) -> list[tuple[Sample, float]]:
        self.start_generation(step, problems)
        return self.collect(problems, stream_to_trainer)

    def start_generation(self, step: int, problems: list[Problem]) -> None:
        """Dispatch step `step`'s prompt groups over the rollout instances (once per step)."""
        if step in self.started:
            return
        self.started.add(step)
        self.rt.service.start_step(step, problems, [self.source.prompt_ids(p) for p in problems])

    def queue_next_generation(self, step: int) -> None:
        """Hand the rollout devices the next generation's queues now, right behind the weight sync
        just queued: each actor runs its calls in order, so an engine starts on them the moment its
        weights arrive, not a driver round trip (logging, checkpoint, planning) later. The next
        generation is step k+1 in sync, k+2 in async (k+1 was generated during this step)."""
        nxt = step + (2 if self.kind == "async" else 1)
        if nxt < self.cfg.run.steps:
            try:
                self.start_generation(nxt, self.source.problems(nxt))
            except Exception:  # noqa: BLE001 - not lost: step `nxt` plans again and raises it there,
                self.started.discard(nxt)  # after this step is logged and checkpointed

    def collect(self, problems: list[Problem], stream_to_trainer: bool = False) -> list[tuple[Sample, float]]:
        """Score every sample of the step in generation as its batch arrives (and train on it).
        Each arrived batch goes to the reward sandbox at once; batches are taken back in arrival
        order as they are scored (a fast reward within SCORE_WAIT_S), so slow rewards overlap the
        generation and arrival of the next batches."""
        scored: list[tuple[Sample, float]] = []
        pending: list[tuple[list[Sample], PendingRewards]] = []
        for batch in self.rt.service.stream():
            pending.append((batch, self.source.submit_scores(problems, batch)))
            pending[-1][1].done(wait_s=SCORE_WAIT_S)
            while pending and pending[0][1].done():
                scored += self.take_scored(*pending.pop(0), stream_to_trainer)
        for batch, rewards in pending:
            scored += self.take_scored(batch, rewards, stream_to_trainer)
        self.rt.service.observe([s for s, _ in scored])
        return scored

    def take_scored(self, batch: list[Sample], rewards: PendingRewards, stream_to_trainer: bool
                    ) -> list[tuple[Sample, float]]:
        results = rewards.result()
        self.reward_results.update((s.sample_id, r) for s, r in zip(batch, results))
        part = [(s, r.value) for s, r in zip(batch, results)]
        if stream_to_trainer:
            self.rt.trainer.feed(part)
        return part

    def publish(self, log: RunLog, step: int, syncing: list) -> float:
        """Wait for weights version `self.version` to reach every rollout device."""
        seconds = max(ray.get(syncing))
        if self.cfg.run.verify_sync:
            leader, rollout = self.rt.digests()
            for device, digest in zip(self.rt.rollout_ranks, rollout):
                if digest != leader:
                    raise PoiseError(f"weight sync of version {self.version}: rollout device {device} holds weights "
                                     f"{digest[:12]} but the trainer holds {leader[:12]}; the sync lost or "
                                     "corrupted a bucket")
            log.event("sync", self.now(), step=step, version=self.version, digest=leader,
                      devices=[self.rt.leader, *self.rt.rollout_ranks])
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
                              round(sum(len(s.prompt_ids) for s, _ in scored) / max(1, len(scored))))
        decision = self.policy.observe(obs)
        log.event("decision", t_end, **decision.event_fields())
        if decision.action != "resize":
            return
        start = self.now()
        if self.cfg.resize.mode == "hard":  # the baseline: stop, checkpoint, rebuild, reload
            report = hard_resize(self.rt, decision.to_split, self.version, step, self.run_dir)
            self.started.discard(step + (2 if self.kind == "async" else 1))  # its generation starts again
            devices = list(range(self.cfg.cluster.devices))  # every device stops
        else:
            report = live_resize(self.rt, decision.to_split, self.version, step, self.cfg.resize.staging_mb)
            devices = report.to_train + report.to_rollout
        self.pending_resize, self.resize_wall = report, (start, self.now())
        t = start
        for phase, seconds in report.phases.items():  # on the switching devices' rows, one after another
            for device in devices:
                log.event("interval", t, device=device, role="resize", phase=phase, step=step, start=t,
                          end=t + seconds)
            t += seconds

    def log_resize(self, log: RunLog, updates: list[dict]) -> None:
        """The `resize` event of the last resize, once its first step showed the barrier wait."""
        report = finish_report(self.rt, self.pending_resize, updates)
        start, end = self.resize_wall
        log.event("resize", start, start=start, end=end, **report.event_fields())
        self.pending_resize = None

    def checkpoint(self, log: RunLog, done: int) -> None:
        run = self.cfg.run
        if done == run.steps or (run.checkpoint_every and done % run.checkpoint_every == 0):
            log.flush()  # the events of the steps this checkpoint covers are on disk before it is
            ray.get(self.rt.workers[self.rt.leader].save_checkpoint.remote(str(self.run_dir), done, self.version))
            prune_checkpoints(self.run_dir, run.keep_checkpoints)

    # --- the log -------------------------------------------------------------------------------
    def log_step(self, log: RunLog, step: int, problems: list[Problem], scored, stats: dict, micro: list[dict],
                 updates: list[dict], times: tuple[float, float, float, float], sync_s: float) -> dict:
        """Events and the metrics row of step `step`: its own samples (each with its own finish time
        and instance), its generation intervals (in async, run during the step before) and its
        training intervals."""
        t_start, t_gen, t_train, t_end = times
        ordered = sorted(scored, key=lambda x: x[0].sample_id)
        samples = [s for s, _ in ordered]
        rewards: dict[SampleId, float] = {s.sample_id: r for s, r in ordered}
        row = step_metrics(step, samples, rewards, problems, stats,
                           {"rollout_s": t_gen - t_start, "train_wait_s": t_train - t_gen, "sync_s": t_end - t_train})
        row["split"] = self.rt.split.as_list()
        results = [(s.sample_id, self.reward_results.pop(s.sample_id)) for s in samples]
        row.update(reward_metrics(r for _, r in results))  # reward/<function> means, reward_failures
        log_failures(log, t_gen, step, results, self.cfg.reward.fallback)
        rel = lambda wall: wall - self.t0  # noqa: E731 - workers report wall-clock times
        for device, start, end in self.rt.service.busy.get(step, []):
            log.event("interval", rel(start), device=device, role="rollout", phase="generate", step=step,
                      start=rel(start), end=rel(end))
        for m in micro:
            log.event("interval", rel(m["start"]), device=m["device"], role="train", phase="micro_batch",
                      step=step, start=rel(m["start"]), end=rel(m["end"]), micro_batch=m["index"])
        for u in updates:
            log.event("interval", rel(u["start"]), device=u["device"], role="train", phase="update",
                      step=step, start=rel(u["start"]), end=rel(u["end"]))
        tokens = self.cfg.run.log_tokens
        for s in samples:
            log.event("sample", rel(s.finish_time), id=list(s.sample_id), step=step,
                      prompt_id=problems[s.sample_id[1]].uid, output_length=len(s.token_ids),
                      weights_version=s.weights_version, instance=self.rt.service.instance_of[s.sample_id],
                      submit=rel(s.submit_time), finish=rel(s.finish_time), reward=rewards[s.sample_id],
                      **({"tokens": list(s.token_ids), "logprobs": list(s.logprobs)} if tokens else {}))
        self.rt.service.forget(step)
        log.event("step", t_end, step=step, start=t_start, end=t_end, rollout_s=t_gen - t_start,
                  train_s=t_train - t_gen, sync_s=sync_s, reward_mean=row["reward_mean"],
                  tokens=row["tokens"], split=row["split"], mode=self.cfg.pipeline.mode)
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
    if resume and cfg.pipeline.mode == "async":
        # the resumed step's samples must come from the weights one version back, which a
        # checkpoint does not hold yet
        raise PoiseError("--resume of pipeline.mode=async is not supported yet; resume it with pipeline.mode=sync "
                         "or colocated (a different trajectory from the resumed step on)")
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
    checkpoint = latest_checkpoint(run_dir) if resume else None
    rewards = RewardScorer(cfg.reward) if emulation is None else None  # the reward sandbox: user code loads there
    source: StepSource = emulation if emulation is not None else \
        TaskSteps(cfg.data, cfg.model, cfg.run.seed, cfg.algorithm.prompts_per_step, rewards)
    split = emulation.split() if emulation is not None else choose_split(cfg, source)
    if not resume:
        dump(cfg, run_dir / "config.yaml")
    policy = resize_policy(cfg, emulation.cost if emulation is not None else None)  # a bad profile fails here
    runtime = Runtime(cfg, split, source, dispatcher, emulation)
    try:
        driver = Driver(cfg, run_dir, runtime, source, policy)
        if checkpoint is not None:
            # every device, rollout or train, restores the same weights (and optimizer state)
            states = ray.get([w.load_checkpoint.remote(str(checkpoint)) for w in runtime.workers])
            driver.start_step, driver.version = states[0]
            truncate_logs(run_dir, driver.start_step)  # no step logged twice
        with RunLog(run_dir, append=resume, background=True, tensorboard=cfg.run.tensorboard) as log:
            return driver.run(log)
    finally:
        runtime.shutdown()
        if rewards is not None:
            rewards.close()  # the reward sandbox's workers end with the run


def _prepare_model(cfg: TrainConfig) -> None:
    from poise.model.loading import load_model

    m = cfg.model
    if m.path is None:
        return
    if m.sft_if_missing and not Path(m.path, "config.json").is_file():
        from poise.train.sft import run_sft

        run_sft(m, cfg.data, Path(m.path), threads=cfg.cluster.threads_per_device, progress=cfg.run.progress)
    load_model(m.path)  # a missing or broken checkpoint fails here with one line
