"""The disaggregated driver loop: `pipeline.mode` sync or async over one device pool.

sync   step k: generate with weights k, stream each sample to the trainer, update -> k+1, publish.
async  step k: the trainer updates on step k's samples (made with weights k-1) while rollout
       generates step k+1 with weights k; then weights k+1 are published. Exact staleness 1
       (docs/design.md invariant 4); step 0 uses the initial weights, the only ones there are.
       With partial rollouts (pipeline.partial_tokens) a sample may span several weights versions,
       at most pipeline.max_staleness behind its update (runtime/partial.py).

Prompts, sampling, the step plan (poise.policy.plan) and the reduction order are those of the
colocated loop, so in `determinism: bitwise` every sample and every update equals the colocated
reference's. Prompts and rewards come from a `StepSource`: the tasks (real compute) or a
scenario (emulated compute); the driver does not know which.
"""

from __future__ import annotations

import json
import sys
import time
import dataclasses
from pathlib import Path

import ray
from ray.exceptions import RayActorError, RayTaskError

from poise.completions import Completions
from poise.config import TrainConfig
from poise.data.prompts import TaskSteps, make_prompt_source, make_tokenizer
from poise.data.tasks import Problem
from poise.episodes.codec import TurnCodec
from poise.episodes.metrics import episode_event_fields, episode_metrics
from poise.episodes.runner import EpisodeRunner
from poise import injection, interrupt, start_up
from poise.errors import PoiseError
from poise.metrics import step_metrics
from poise.policy.controller import ResizeController, ResizePolicy, StepObservation
from poise.policy.plan import StepPlan, plan_step
from poise.policy.split import Split
from poise.rewards.functions import resolve_functions
from poise.rewards.scorer import RewardScorer, log_failures, reward_metrics
from poise.rundir import prepare_run_dir, resume_line, run_clock, truncate_logs
from poise.runlog import RunLog
from poise.runtime import faults
from poise.runtime.collect import Collector, DynamicStep
from poise.runtime.evaluation import RolloutEvaluation
from poise.runtime.partial import PartialPool
from poise.runtime.resize import ResizeReport, finish_report, hard_resize, live_resize
from poise.runtime.runtime import Runtime, StepSource, choose_split, resize_policy
from poise.runtime.scale import ScaleOut
from poise.runtime.topology import Topology
from poise.schema import dump, to_dict
from poise.training.checkpoint import (PENDING_SAMPLES, check_finite, checkpoint_dir, decode_samples,
                                    encode_samples, latest_checkpoint, prune_before_save, prune_checkpoints)
from poise.training.progress import StepProgress
from poise.types import Sample, SampleId

DYNAMIC_DRAWS = "dynamic_draws.json"  # an async checkpoint's next step: which draw each slot holds


@dataclasses.dataclass
class Trained:
    """A step once its update is done: what it trained on, the trainer's report and its times (run
    time, seconds), and its weight sync."""

    scored: list[tuple[Sample, float]]  # the samples with the rewards the algorithm saw
    stats: dict  # the update's statistics (loss, KL, grad norm, ...)
    micro: list[dict]  # each micro-batch's device and wall-clock start and end
    updates: list[dict]  # each train device's optimizer step: start, end, traffic, barrier wait
    t_gen: float  # generation over (async: the step's samples fed, the next step's collected)
    t_train: float  # the update done
    syncing: list | None = None  # the weight-sync calls; None after a recovery: they go out again
    sync_s: float = 0.0  # the weight sync's seconds, once published


class Driver:
    def __init__(self, cfg: TrainConfig, run_dir: Path, runtime: Runtime, source: StepSource,
                 policy: ResizePolicy | None = None):
        self.cfg, self.run_dir, self.rt, self.source = cfg, run_dir, runtime, source
        self.kind = cfg.pipeline.kind  # sync | stream | async
        # static, a schedule, or the controller
        self.policy = policy if policy is not None else resize_policy(cfg, runtime.emulation_cost)
        self.pending_resize: ResizeReport | None = None  # completed by the first step on the new split
        self.resize_from: Topology | None = None  # the topology a resize started from, while it runs
        self.resize_wall = (0.0, 0.0)  # run-time start and end of the pending resize
        self.version = 0
        self.start_step = 0
        self.t0 = time.time()
        self.generated: dict[int, list[tuple[Sample, float]]] = {}  # async: the next step, already generated
        self.started: set[int] = set()  # steps whose generation was handed to the rollout devices
        self.trained: Trained | None = None  # the step once its update is done, until published
        self.syncing: list = []  # the step's weight-sync calls, once queued
        self.injector = injection.DriverFaults(runtime.spec.faults)  # none unless the run injects them
        self.recoveries = 0
        # reserve devices joining as rollout instances
        self.scale = ScaleOut(cfg.cluster, cfg.scale, cfg.run.steps, self.kind, runtime, self.now)
        self.evaluation = RolloutEvaluation.of(cfg, source)  # eval.every: held-out problems between steps
        # RUN_DIR/completions.jsonl; emulated compute has no tokenizer and no text
        self.completions = Completions.of(cfg.run.log_completions, getattr(source, "tokenizer", None))
        self.episodes: EpisodeRunner | None = None  # env.name: multi-turn episodes (poise.episodes)
        if cfg.env.path is not None:
            self.episodes = EpisodeRunner(cfg.env, source.rewards, TurnCodec(source.tokenizer, cfg.data.chat_template),
                                          cfg.algorithm.sampling.max_new_tokens, runtime.spec.rollout.max_context,
                                          cfg.run.seed)
        self.collector = Collector(runtime, source, cfg.algorithm, self.kind, self.injector, self.episodes)
        # pipeline.partial_tokens: samples keep generating across weight updates (runtime/partial.py)
        self.partial = PartialPool(runtime, source, self.collector, cfg.algorithm, cfg.pipeline) \
            if cfg.pipeline.partial and self.kind == "async" else None

    def now(self) -> float:
        return time.time() - self.t0

    # --- the loop ------------------------------------------------------------------------------
    def run(self, log: RunLog) -> list[dict]:
        cfg, metrics_rows = self.cfg, []
        with StepProgress("train", cfg.run.steps, enabled=cfg.run.progress, completed=self.start_step) as bar, \
                interrupt.graceful(self.run_dir):
            for step in range(self.start_step, cfg.run.steps):
                t_start = self.now()
                problems = self.source.problems(step)
                # generate, score, train, publish; after a worker death, again from the phase that broke
                trained = self.survive(log, step, "step", lambda: self.step(log, step, problems))
                times = (t_start, trained.t_gen, trained.t_train, self.now())
                check_finite(step, trained.stats, self.run_dir)  # a NaN update stops the run before any save
                evals = self.survive(log, step, "eval", lambda: self.evaluation.after_step(self.rt, step, self.version)
                                     ) if self.evaluation is not None else {}  # eval/...: held-out, on rollout devices
                row = self.log_step(log, step, problems, trained, times, evals)
                metrics_rows.append(row)
                stop = interrupt.requested()  # read once: the checkpoint below is the one a stop needs
                self.survive(log, step, "checkpoint", lambda: self.checkpoint(log, step + 1, force=bool(stop)))
                bar.advance(reward=row["reward_mean"], len=row["response_len_mean"], tok_s=row["tokens_per_s"])
                start_up.first_step()
                if stop:
                    raise interrupt.Stopped(stop, step + 1, checkpoint_dir(self.run_dir, step + 1))
                self.maybe_resize(log, step, trained.scored, times)  # the split of step k+1
                self.maybe_scale_out(log, step, trained, times)  # reserve devices join for step k+1
        return metrics_rows

    def maybe_scale_out(self, log: RunLog, step: int, trained: Trained, times: tuple[float, float, float, float]
                        ) -> None:
        """Once per step the scale policy decides; joined reserve devices are rollout devices from here on."""
        joined = self.scale.after_step(log, step, times, trained.micro, trained.updates, self.version)
        if joined is not None:
            self.rt.install(joined)

    def step(self, log: RunLog, step: int, problems: list[Problem]) -> Trained:
        """Step `step` up to weights version k+1 on every rollout device: train, then publish. After
        a recovery it goes on from the phase that broke: once its update is done (`self.trained`),
        only the weights go out again."""
        if self.trained is None:
            self.trained = self.train(log, step, problems)
            syncing = self.trained.syncing
        else:
            syncing = self.publish_again(step)
        self.injector.at(self.rt, "publish", step)
        trained = self.trained
        trained.sync_s = self.publish(log, step, syncing)  # weights version k+1 on every rollout device
        self.trained = None
        self.generated.pop(step, None)
        return trained

    def train(self, log: RunLog, step: int, problems: list[Problem]) -> Trained:
        """Generate, score and train step `step`, and queue its weight sync behind the last update."""
        # expected ids, mini/micro-batches and owners; the weights version its last update makes
        self.rt.trainer.start_step(self.plan(step), self.version + 1)
        scored = self.feed_async(step, problems) if self.kind == "async" else self.feed_sync(step, problems)
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
        return Trained(scored, stats, micro, updates, t_gen, t_train, syncing)

    def feed_sync(self, step: int, problems: list[Problem]) -> list[tuple[Sample, float]]:
        """sync: generate step `step` with weights k; each sample goes to the trainer the moment it
        is scored. After a recovery the samples it kept are fed again."""
        if step in self.generated:  # a recovery kept the step's samples: train on them
            scored = self.generated[step]
            self.rt.trainer.feed(sorted(scored, key=lambda x: x[0].sample_id))
            return scored
        scored = self.generated[step] = self.generate(step, problems, stream_to_trainer=True)
        return scored

    def feed_async(self, step: int, problems: list[Problem]) -> list[tuple[Sample, float]]:
        """async: train on step k (generated during step k-1, with weights k-1) while step k+1
        generates with weights k, its micro-batches put in the object store as they complete."""
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
            self.generated[step + 1] = self.collect(step + 1, ahead, self.version)
        return scored

    def publish_again(self, step: int) -> list:
        """Re-entry after a recovery that followed step `step`'s update: the new actors hold the
        weights they generated with. In async the next step's samples come first, with the weights
        before this update; then weights k+1 go out again. Returns the sync's calls."""
        ahead = step + 1 < self.cfg.run.steps and step + 1 not in self.generated
        if self.kind == "async" and ahead:  # first the next step's samples, with the weights before it
            problems_ahead = self.source.problems(step + 1)
            self.start_generation(step + 1, problems_ahead)
            self.generated[step + 1] = self.collect(step + 1, problems_ahead, self.version - 1)
        syncing = self.rt.publish_refs(self.version, None)
        self.queue_next_generation(step)
        return syncing

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
            self.rt.install(self.resize_from)
        if phase == "step" and self.trained is None:
            done = faults.settled_updates(self.rt.trainer, c.step_timeout_s)
            if done == "some":
                raise faults.RunFailure(faults.unrecoverable(
                    self.rt, lost.devices, step, self.run_dir, "some of its updates had already happened"))
            if done == "all":  # async: the update ended on every train device, the next step's generation broke
                stats, micro, updates = self.rt.trainer.finish_step()
                self.version += 1
                self.trained = Trained(self.generated[step], stats, micro, updates, self.now(), self.now())
        phase = "publish" if self.trained is not None else phase
        broken = faults.step_refs(self.rt.trainer) + self.syncing + list(self.trained and self.trained.syncing or [])
        recovery = faults.recover(self.rt, lost, step, self.version, rollout_version, self.run_dir, c)
        self.rt.install(recovery.topology)
        faults.drain(broken)  # the dead step's failed calls: read here, not printed by Ray as unhandled
        if self.trained is not None:  # publish again (publish_again): the rollout devices hold the weights
            self.trained.syncing = None  # they generated with, which an async step may still need
        self.started = set(self.generated)  # what the dead actors were generating starts again
        killed = self.injector.kill_time()
        log.event("recovery", self.now(), step=step, phase=phase, devices=lost.devices, source=recovery.source,
                  detect_s=(detected - killed) if killed else None, recover_s=time.time() - detected,
                  silent=recovery.silent,
                  **({"killed": self.injector.where} if self.injector.where else {}))
        print(f"poise: warning: {recovery.what}", file=sys.stderr)

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
        if self.cfg.algorithm.dynamic_sampling or self.partial is not None:  # slot i holds draw slots[i]
            saved = json.loads((checkpoint / DYNAMIC_DRAWS).read_text())
            problems = self.partial.restore(checkpoint, saved["slots"]) if self.partial is not None else \
                self.source.draws(step, saved["slots"])
            self.collector.dynamic[step] = DynamicStep(saved["slots"], problems, saved["metrics"])
        samples = [s for s, _ in pending]
        results = self.source.submit_scores(problems, samples).result()
        self.collector.reward_results.update((s.sample_id, r) for s, r in zip(samples, results))
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
        return self.collect(step, problems, self.version, stream_to_trainer)

    def collect(self, step: int, problems: list[Problem], version: int, stream_to_trainer: bool = False
                ) -> list[tuple[Sample, float]]:
        """Step `step`'s samples, scored, generated with weights `version`: as they arrive, or, with
        partial rollouts, a phase of the pool (which hands its work out itself)."""
        if self.partial is not None:
            return self.partial.phase(step, version)
        return self.collector.collect(problems, stream_to_trainer, step=step)

    def start_generation(self, step: int, problems: list[Problem]) -> None:
        """Dispatch step `step`'s prompt groups over the rollout instances (once per step)."""
        if step in self.started or self.partial is not None:  # partial rollouts: the phase dispatches
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
        self.resize_from = self.rt.topology
        report, devices = self.survive(log, step, "resize", lambda: self.resize(decision.target, step))
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
        self.injector.at(self.rt, "resize", step)  # an injected death as the resize starts
        if self.cfg.resize.mode == "hard":  # the baseline: stop, checkpoint, rebuild, reload
            topology, report = hard_resize(self.rt, to, self.version, step, self.run_dir, self.cfg.cluster)
            self.rt.install(topology)
            self.started.discard(step + (2 if self.kind == "async" else 1))  # its generation starts again
            return report, list(range(self.cfg.cluster.devices))  # every device stops
        topology, report = live_resize(self.rt, to, self.version, step, self.cfg.cluster, self.cfg.resize)
        self.rt.install(topology)
        return report, report.to_train + report.to_rollout

    def log_resize(self, log: RunLog, updates: list[dict]) -> None:
        """The `resize` event of the last resize, once its first step showed the barrier wait."""
        report = finish_report(self.rt, self.pending_resize, updates, self.cfg.cluster)
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
                if done in self.collector.dynamic:
                    d = self.collector.dynamic[done]
                    extra[DYNAMIC_DRAWS] = json.dumps({"slots": d.slots, "metrics": d.metrics}).encode()
                if self.partial is not None:  # the pool: unfinished and finished-untrained samples
                    extra.update(self.partial.checkpoint_files())
            prune_before_save(self.run_dir, run.keep_checkpoints, done)  # room first: the disk may be full
            # the driver's run.dir: written there by the leader, or through the driver (runtime/storage.py)
            self.rt.store.save(self.rt.leader, self.rt.workers[self.rt.leader], self.run_dir, done, self.version,
                               extra, f"the checkpoint after step {done - 1}")
            prune_checkpoints(self.run_dir, run.keep_checkpoints)

    # --- the log -------------------------------------------------------------------------------
    def log_step(self, log: RunLog, step: int, problems: list[Problem], trained: Trained,
                 times: tuple[float, float, float, float], evals: dict | None = None) -> dict:
        """Events and the metrics row of step `step`: its own samples (each with its own finish time
        and instance), its generation intervals (in async, run during the step before) and its
        training intervals."""
        t_start, t_gen, t_train, t_end = times
        scored, stats, micro, updates = trained.scored, trained.stats, trained.micro, trained.updates
        dynamic = self.collector.dynamic.pop(step, None)
        problems = dynamic.problems if dynamic is not None else problems  # slot i's problem
        ordered = sorted(scored, key=lambda x: x[0].sample_id)
        samples = [s for s, _ in ordered]
        rewards: dict[SampleId, float] = {s.sample_id: r for s, r in ordered}
        row = step_metrics(step, samples, rewards, problems, stats,
                           {"rollout_s": t_gen - t_start, "train_wait_s": t_train - t_gen, "sync_s": t_end - t_train})
        row["split"] = self.rt.split.as_list()
        row.update(dynamic.metrics if dynamic is not None else {})
        if self.cfg.algorithm.overlong_buffer:
            row["reward/overlong"] = sum(self.collector.shaped(s, 0.0) for s in samples) / len(samples)
        results = [(s.sample_id, self.collector.reward_results.pop(s.sample_id)) for s in samples]
        row.update(reward_metrics(r for _, r in results))  # reward/<function> means, reward_failures
        if self.episodes is not None:  # turns, model and observation tokens, environment time and failures
            row.update(episode_metrics([self.episodes.stats.pop(s.sample_id) for s in samples],
                                       self.collector.episode_counters.pop(step, None)))
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
                      **({"token_versions": list(s.token_versions)} if tokens and s.token_versions else {}),
                      **episode_event_fields(s, tokens))
        if self.completions is not None:
            log.completions(self.completions.rows(step, samples, problems, rewards, dict(results)))
        self.rt.service.forget(step)
        log.event("step", t_end, step=step, start=t_start, end=t_end, rollout_s=t_gen - t_start,
                  train_s=t_train - t_gen, sync_s=trained.sync_s, reward_mean=row["reward_mean"],
                  tokens=row["tokens"], split=row["split"], mode=self.cfg.pipeline.mode)
        row.update(evals or {})  # eval/...: the held-out metrics of this step's weights
        log.metrics(row)
        return row


def train_disaggregated(cfg: TrainConfig, resume: bool = False, dispatcher=None) -> list[dict]:
    if resume and cfg.scale.active:  # the joined devices are not in a checkpoint
        raise PoiseError("--resume with scale.schedule or scale.policy=controller is not supported yet; resume with "
                         "scale.policy=static (the same trajectory, on the pool without the joined devices)")
    injection.current()  # a POISE_FAULTS that does not load fails here, before any work
    run_dir = prepare_run_dir(cfg, resume)
    start_up.begin(run_dir)
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
        start_up.end()
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
