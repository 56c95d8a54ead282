"""The disaggregated driver loop: `pipeline.mode` sync or async over one device pool.

sync   step k: generate with weights k, stream each sample to the trainer, update -> k+1, publish.
async  step k: the trainer updates on step k's samples (made with weights k-1) while rollout
       generates step k+1 with weights k; then weights k+1 are published. Exact staleness 1
       (DESIGN.md invariant 4); step 0 uses the initial weights, the only ones there are.

Prompts, sampling, micro-batches and the reduction order are those of the colocated loop, so in
`determinism: bitwise` every sample and every update equals the colocated reference's.
"""

from __future__ import annotations

import time
from pathlib import Path

import ray

from poise.config import TrainConfig
from poise.data.tasks import Problem, reward
from poise.errors import PoiseError
from poise.runlog import RunLog
from poise.runtime.cluster import connect, device_pool, free_port
from poise.runtime.service import StreamGenerationService, make_ranker_and_dispatcher
from poise.runtime.trainer_group import TrainerGroup
from poise.runtime.worker import DeviceWorker, WorkerSpec
from poise.schema import dump
from poise.train.checkpoint import latest_checkpoint
from poise.train.colocated import prepare_run_dir, step_metrics, truncate_metrics
from poise.train.progress import StepProgress
from poise.train.setup import encode_prompt, make_prompt_source, make_tokenizer


class Runtime:
    """The job's devices, roles, communicators, and the two services over them."""

    def __init__(self, cfg: TrainConfig, split: tuple[int, int], dispatcher=None, emulation=None):
        self.cfg = cfg
        c, algo = cfg.cluster, cfg.algorithm
        connect(c)
        self.pool = device_pool(c)
        spec = WorkerSpec(cfg.model, cfg.data.tokenizer, algo, cfg.rollout, cfg.run.seed, c.threads_per_device,
                          cfg.determinism == "bitwise", c.device,
                          emulation.device_spec if emulation is not None else None)
        port = free_port()
        resources = {"num_gpus": 1} if c.device == "cuda" else {}
        self.workers = [DeviceWorker.options(scheduling_strategy=self.pool.strategy(d), num_cpus=1, **resources)
                        .remote(d, c.devices, port, spec) for d in range(c.devices)]
        rollout, train = split
        self.rollout_ranks = list(range(rollout))
        self.train_ranks = list(range(rollout, rollout + train))
        self.leader = self.train_ranks[0]
        # every worker creates the same groups in the same order: dist.new_group is collective
        ray.get([w.prewarm_groups.remote([self.train_ranks, [self.leader] + self.rollout_ranks])
                 for w in self.workers])
        ray.get([self.workers[d].set_role.remote("rollout") for d in self.rollout_ranks]
                + [self.workers[d].set_role.remote("train") for d in self.train_ranks])
        ranker, default = make_ranker_and_dispatcher(cfg.dispatch.policy, cfg.dispatch.ranker, cfg.run.seed,
                                                        cfg.dispatch.long_tail_fraction, cfg.dispatch.tail_batch_cap,
                                                        prompt_len=16)
        if emulation is not None:  # the scenario's dispatch policy and ranker, as the simulator builds them
            ranker, default = emulation.ranker, emulation.dispatcher
        dispatcher = dispatcher or default  # tests inject reordering or lossy dispatchers
        self.service = StreamGenerationService([self.workers[d] for d in self.rollout_ranks], self.rollout_ranks,
                                               dispatcher, ranker, algo.group_size, cfg.rollout.num_slots)
        if emulation is not None:  # a poll batches finishes over wall seconds: scale it with the compute
            self.service.poll_seconds *= emulation.device_spec.time_scale
        self.trainer = TrainerGroup([self.workers[d] for d in self.train_ranks], self.train_ranks,
                                    algo.micro_batch_size, algo.updates_per_step, algo.group_size,
                                    algo.scale_rewards, cfg.pipeline.streaming, algo.loss_agg)

    def publish_weights(self, version: int) -> float:
        return self.service.publish_weights(self.workers[self.leader], self.leader, version,
                                            self.cfg.rollout.weight_bucket_mb)

    def shutdown(self) -> None:
        for w in self.workers:
            ray.kill(w)
        self.pool.release()


class Driver:
    def __init__(self, cfg: TrainConfig, run_dir: Path, runtime: Runtime, emulation=None):
        self.cfg, self.run_dir, self.rt = cfg, run_dir, runtime
        self.emulation = emulation  # emulated compute: prompts, prompt ids and rewards from a scenario
        self.tokenizer = make_tokenizer(cfg.data, cfg.model)
        self.source = make_prompt_source(cfg.data, cfg.run.seed)
        self.version = 0
        self.start_step = 0
        self.t0 = time.time()

    def now(self) -> float:
        return time.time() - self.t0

    # --- phases --------------------------------------------------------------------------------
    def prompts(self, step: int) -> list[Problem]:
        if self.emulation is not None:
            return self.emulation.problems(step)
        return self.source.prompts_for_step(step, self.cfg.algorithm.prompts_per_step)

    def score(self, problems: list[Problem], sample) -> float:
        if self.emulation is not None:
            return self.emulation.reward(sample)
        eos = self.tokenizer.eos_id
        return reward(problems[sample.sample_id[1]], self.tokenizer.decode([t for t in sample.token_ids if t != eos]))

    def generate(self, step: int, problems: list[Problem], feed_trainer: bool) -> list:
        """Dispatch the step's prompts; each finished sample goes to the trainer at once if asked."""
        encode = self.emulation.prompt_ids if self.emulation is not None else \
            (lambda p: encode_prompt(self.tokenizer, p))
        self.rt.service.start_step(step, problems, [encode(p) for p in problems])
        samples = []
        for sample, _device in self.rt.service.stream():
            samples.append(sample)
            if feed_trainer:
                self.rt.trainer.feed(sample, self.score(problems, sample))
        self.rt.service.observe(samples)
        return samples

    def train_on(self, samples: list, problems: list[Problem]) -> None:
        for sample in sorted(samples, key=lambda s: s.sample_id):
            self.rt.trainer.feed(sample, self.score(problems, sample))

    # --- the loop ------------------------------------------------------------------------------
    def run(self, log: RunLog) -> list[dict]:
        cfg, rows = self.cfg, []
        asynchronous = cfg.pipeline.mode == "async"
        ahead: tuple[list[Problem], list] | None = None  # async: the next step, already generated
        with StepProgress("train", cfg.run.steps, enabled=cfg.run.progress, completed=self.start_step) as bar:
            for step in range(self.start_step, cfg.run.steps):
                t_start = self.now()
                problems = self.prompts(step)
                self.rt.trainer.start_step(step, len(problems))
                if asynchronous:
                    samples = ahead[1] if ahead else self.generate(step, problems, feed_trainer=False)
                    self.train_on(samples, problems)
                    if step + 1 < cfg.run.steps:  # overlaps the update queued just above
                        nxt = self.prompts(step + 1)
                        ahead = (nxt, self.generate(step + 1, nxt, feed_trainer=False))
                else:
                    samples = self.generate(step, problems, feed_trainer=True)
                t_gen = self.now()
                stats = self.rt.trainer.finish_step()
                t_train = self.now()
                self.version += 1
                sync_s = self.rt.publish_weights(self.version)
                t_end = self.now()
                row = step_metrics(step, samples, self.rt.trainer.rewards, problems, _public(stats),
                                   {"rollout_s": t_gen - t_start, "train_wait_s": t_train - t_gen,
                                    "sync_s": t_end - t_train})
                row["split"] = [len(self.rt.rollout_ranks), len(self.rt.train_ranks)]
                self.log_step(log, step, samples, problems, stats, t_start, t_gen, t_end, row, sync_s)
                log.metrics(row)
                rows.append(row)
                done = step + 1
                if done == cfg.run.steps or (cfg.run.checkpoint_every and done % cfg.run.checkpoint_every == 0):
                    ray.get(self.rt.workers[self.rt.leader].save_checkpoint.remote(str(self.run_dir), done,
                                                                                   self.version))
                bar.advance(reward=row["reward_mean"], len=row["response_len_mean"], tok_s=row["tokens_per_s"])
        return rows

    def log_step(self, log: RunLog, step: int, samples, problems, stats, t_start, t_gen, t_end, row, sync_s) -> None:
        rel = lambda wall: wall - self.t0  # noqa: E731 - workers report wall-clock times
        for inst in self.rt.service.instances:
            if inst.busy_start is not None:
                log.event("interval", rel(inst.busy_start), device=inst.device, role="rollout", phase="generate",
                          step=step, start=rel(inst.busy_start), end=rel(inst.busy_end))
        for m in stats["micro_batches"]:
            log.event("interval", rel(m["start"]), device=m["device"], role="train", phase="micro_batch",
                      step=step, start=rel(m["start"]), end=rel(m["end"]), micro_batch=m["index"])
        for per_device in stats["updates"]:
            for u in per_device:
                log.event("interval", rel(u["start"]), device=u["device"], role="train", phase="update",
                          step=step, start=rel(u["start"]), end=rel(u["end"]))
        for s in samples:
            log.event("sample", t_gen, id=list(s.sample_id), step=step, prompt_id=problems[s.sample_id[1]].uid,
                      output_length=len(s.token_ids), weights_version=s.weights_version,
                      instance=_instance_of(self.rt, s), submit=t_start, finish=t_gen,
                      **({"tokens": list(s.token_ids)} if self.cfg.run.log_tokens else {}))
        log.event("step", t_end, step=step, start=t_start, end=t_end, rollout_s=t_gen - t_start,
                  train_s=row["phases"]["train_wait_s"], sync_s=sync_s, reward_mean=row["reward_mean"],
                  tokens=row["tokens"], split=row["split"], mode=self.cfg.pipeline.mode)


def _instance_of(rt: Runtime, sample) -> int:
    plan = rt.service.last_plan
    if plan is None:
        return -1
    return dict(plan.order).get(sample.sample_id[1], -1)


def _public(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if k not in ("micro_batches", "updates")}


def choose_split(cfg: TrainConfig) -> tuple[int, int]:
    if cfg.cluster.split:
        return cfg.cluster.split[0], cfg.cluster.split[1]
    from poise.policy.allocator import StepWorkload, allocate
    from poise.policy.cost import CostModel

    # A representative step: the reference answers' lengths (+EOS) of step 0's prompts.
    source = make_prompt_source(cfg.data, cfg.run.seed)
    problems = source.prompts_for_step(0, cfg.algorithm.prompts_per_step)
    lengths = tuple(len(p.answer) + 1 for p in problems for _ in range(cfg.algorithm.group_size))
    mode = "async" if cfg.pipeline.mode == "async" else ("stream" if cfg.pipeline.streaming else "sync")
    alloc = allocate(CostModel(), StepWorkload(lengths, 16), cfg.cluster.devices, mode)
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
    emulation = None
    if cfg.cluster.compute == "emulated":  # no model anywhere: no warm start, nothing to load
        from poise.runtime.emulated import Emulation

        emulation = Emulation.from_config(cfg, resume)  # a bad scenario fails here, before Ray starts
        cfg = emulation.cfg  # prompts per step and group size are the scenario workload's
    else:
        _prepare_model(cfg)
    checkpoint = latest_checkpoint(run_dir) if resume else None
    split = emulation.split() if emulation is not None else choose_split(cfg)
    if not resume:
        dump(cfg, run_dir / "config.yaml")
    runtime = Runtime(cfg, split, dispatcher, emulation)
    try:
        driver = Driver(cfg, run_dir, runtime, emulation)
        if checkpoint is not None:
            # every device, rollout or train, restores the same weights (and optimizer state)
            states = ray.get([w.load_checkpoint.remote(str(checkpoint)) for w in runtime.workers])
            driver.start_step, driver.version = states[0]
            truncate_metrics(run_dir, driver.start_step)
        with RunLog(run_dir, append=resume) as log:
            return driver.run(log)
    finally:
        runtime.shutdown()


def _prepare_model(cfg: TrainConfig) -> None:
    from poise.model.loading import load_model

    m = cfg.model
    if m.path is None:
        return
    if m.sft_if_missing and not Path(m.path, "config.json").is_file():
        from poise.train.sft import run_sft

        run_sft(m, cfg.data, Path(m.path), threads=cfg.cluster.threads_per_device, progress=cfg.run.progress)
    load_model(m.path)  # a missing or broken checkpoint fails here with one line
