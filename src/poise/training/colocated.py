"""The colocated GRPO loop: one process, the semantic reference for every distributed mode.

Each step: the prompts of step k (a function of seed and k), G responses each under weights
version k, exact rewards, group-normalised advantages, one update -> version k + 1.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch

from poise import injection, interrupt, start_up
from poise.algo.advantages import ready_advantages
from poise.algo.shaping import overlong_penalty
from poise.completions import Completions
from poise.config import TrainConfig
from poise.data.prompts import TaskSteps, fitted_context
from poise.data.tasks import Problem
from poise.episodes.codec import TurnCodec
from poise.episodes.metrics import episode_event_fields, episode_metrics, with_env_rewards
from poise.episodes.runner import EpisodeRunner
from poise.metrics import step_metrics
from poise.policy.dynamic import DrawResolver, default_max_draws
from poise.rollout.backends import build_engine
from poise.rewards.scorer import RewardResult, RewardScorer, log_failures, reward_metrics
from poise.rundir import prepare_run_dir, resume_line, run_clock, truncate_logs
from poise.runlog import RunLog
from poise.schema import dump, to_dict
from poise.training.checkpoint import (TrainState, check_finite, checkpoint_dir, latest_checkpoint, load_checkpoint,
                                    prune_before_save, prune_checkpoints, save_checkpoint)
from poise.training.progress import StepProgress
from poise.training.determinism import bitwise_cuda
from poise.training.setup import compute_dtype, make_model, make_policy, pin_threads, run_device
from poise.training.trainer import PolicyTrainer
from poise.types import Request, SampleId, trained_tokens


class ColocatedLoop:
    def __init__(self, cfg: TrainConfig, run_dir: Path):
        self.cfg = cfg
        self.run_dir = run_dir
        algo = cfg.algorithm
        pin_threads(cfg.cluster.threads_per_device, cfg.determinism == "bitwise")
        self.device = run_device(cfg.cluster.device)  # before the reward sandbox: a missing GPU fails first
        torch.manual_seed(cfg.run.seed)
        # the reward sandbox starts first: a reward function that cannot load fails before any work
        self.steps = TaskSteps(cfg.data, cfg.model, cfg.run.seed, algo.prompts_per_step,
                               RewardScorer(cfg.reward, cfg.env))
        self.tokenizer = self.steps.tokenizer
        self.completions = Completions.of(cfg.run.log_completions, self.tokenizer)  # RUN_DIR/completions.jsonl
        dtype = compute_dtype(cfg.model.dtype, cfg.cluster.device)
        self.model = make_policy(cfg, self.tokenizer, self.device, dtype, progress=cfg.run.progress)
        start_up.phase("loaded", f"reward sandbox started, model loaded on {self.device.type} "
                                 "(colocated: one process, no Ray)")
        if cfg.determinism == "bitwise":  # a no-op on CPU
            bitwise_cuda(self.device, self.model.config.model_type)
        ref = None
        if algo.kl_coef > 0:
            ref = make_model(cfg, self.tokenizer, self.device, dtype, progress=False).requires_grad_(False).eval()
        self.trainer = PolicyTrainer(self.model, algo, self.tokenizer.pad_id, ref)
        # The engine runs the trainer's own modules: colocated weights need no sync.
        context = fitted_context(cfg.model, cfg.rollout.max_context, self.steps.longest_prompt(),
                                 cfg.env.response_tokens(algo.sampling.max_new_tokens))  # the KV cache the run needs
        self.engine = build_engine(self.model, dataclasses.replace(cfg.rollout, max_context=context), algo.sampling,
                                   cfg.run.seed, self.tokenizer.eos_id)
        self.state = TrainState(step=0, weights_version=0)
        self.episodes = None  # env.name: multi-turn episodes (poise.episodes)
        if cfg.env.path is not None:
            self.episodes = EpisodeRunner(cfg.env, self.steps.rewards, TurnCodec(self.tokenizer, cfg.data.chat_template),
                                          algo.sampling.max_new_tokens, self.engine.context, cfg.run.seed)
        self.heldout = None  # eval.every: held-out problems, evaluated between steps (poise.evaluation)
        if cfg.eval.every:
            from poise.evaluation.heldout import HeldOut

            self.heldout = HeldOut(cfg.eval, cfg.data, cfg.model, cfg.run.seed, self.steps.rewards)
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    # --- the phases of one step -------------------------------------------------------------
    def generate(self, step: int, problems: list[Problem]):
        g = self.cfg.algorithm.group_size
        self.engine.set_weights_version(self.state.weights_version)
        if self.episodes is not None:
            return self.generate_episodes(step, problems)
        samples = self.engine.generate(Request((step, i, j), self.steps.prompt_ids(p))
                                       for i, p in enumerate(problems) for j in range(g))
        return sorted(samples, key=lambda s: s.sample_id)

    def generate_episodes(self, step: int, problems: list[Problem]):
        """The step's episodes: a turn that finishes goes to its environment while the others decode;
        the next turn joins the engine's queue when the environment answers (poise.episodes.runner)."""
        runner = self.episodes
        runner.start(step, problems, [self.steps.prompt_ids(p) for p in problems], self.cfg.algorithm.group_size,
                     self.state.weights_version)
        finished = []
        while runner.active:
            requests, done = runner.poll(wait_s=0.05 if self.engine.occupancy.idle else 0.0)
            for request in requests:
                self.engine.submit(request)
            finished += done
            if not self.engine.occupancy.idle:
                runner.turns_done(self.engine.step())
        return sorted(finished, key=lambda s: s.sample_id)

    def score(self, problems: list[Problem], samples) -> dict[SampleId, RewardResult]:
        """Every sample's reward, from the reward sandbox (the step's samples are all generated); an
        episode's adds its environment's rewards."""
        scored = dict(zip((s.sample_id for s in samples), self.steps.submit_scores(problems, samples).result()))
        return scored if self.episodes is None else with_env_rewards(scored, self.episodes.stats)

    def shaped(self, sample, reward: float) -> float:
        """The reward the algorithm sees: the reward functions' plus overlong shaping (algo/shaping.py)."""
        a = self.cfg.algorithm
        return reward + overlong_penalty(trained_tokens(sample), a.sampling.max_new_tokens, a.overlong_buffer,
                                         a.overlong_penalty)

    def generate_dynamic(self, step: int, problems: list[Problem]):
        """Dynamic sampling (policy/dynamic.py): generate and score the step's draws, then a new draw
        for each dropped group, until every slot holds a group. Returns the slots' samples
        (relabelled (step, slot, j)), their reward results, the slots' problems and the metrics."""
        a = self.cfg.algorithm
        resolver = DrawResolver(a.prompts_per_step, a.group_size, default_max_draws(a.prompts_per_step,
                                                                                     a.max_prompt_draws))
        todo = resolver.start()
        by_draw = dict(enumerate(problems))
        drawn: dict[SampleId, tuple] = {}
        self.engine.set_weights_version(self.state.weights_version)
        while todo:
            batch = sorted(self.engine.generate(Request((step, d, j), self.steps.prompt_ids(by_draw[d]))
                                                for d in todo for j in range(a.group_size)),
                           key=lambda s: s.sample_id)
            todo = []
            for s, r in zip(batch, self.steps.submit_scores(by_draw, batch).result()):
                drawn[s.sample_id] = (s, r)
                todo += resolver.scored(s.sample_id, self.shaped(s, r.value))
            by_draw.update(zip(todo, self.steps.draws(step, todo)))
        samples, results = [], {}
        for slot, draw in resolver.assign():
            for j in range(a.group_size):
                s, r = drawn[(step, draw, j)]
                samples.append(dataclasses.replace(s, sample_id=(step, slot, j)))
                results[samples[-1].sample_id] = r
        generated = [self.shaped(s, r.value) for s, r in drawn.values()]
        metrics = {**resolver.metrics(), "dynamic/reward_mean_generated": sum(generated) / len(generated)}
        return samples, results, [by_draw[d] for d in resolver.slots], metrics

    def advantages(self, rewards: dict[SampleId, float], step: int, n_prompts: int) -> dict[SampleId, float]:
        algo = self.cfg.algorithm
        out: dict[SampleId, float] = {}
        for i in range(n_prompts):  # group by group (or the step at once), as the runtime's trainer group does
            out.update(ready_advantages(algo.advantage, rewards, (step, i, algo.group_size - 1), algo.group_size,
                                        n_prompts, algo.std_eps))
        return out

    def train(self, samples, advantages: dict[SampleId, float]) -> dict:
        stats = self.trainer.train_step(samples, advantages)
        if self.device.type == "cuda":  # the step's kernels are queued, not done: train_s times them
            torch.cuda.synchronize(self.device)
        self.state = TrainState(self.state.step + 1, self.state.weights_version + 1)
        return stats

    def evaluate(self, step: int) -> dict:
        """Held-out metrics of the weights step `step` made (eval.every, and the last step); {} otherwise."""
        if self.heldout is None or not self.heldout.due(step, self.cfg.run.steps):
            return {}
        from poise.evaluation.engine import evaluate_model

        return evaluate_model(self.heldout, self.model, self.cfg.model, self.cfg.rollout, self.cfg.algorithm.sampling,
                              self.cfg.run.seed, self.tokenizer.eos_id, self.state.weights_version)

    # --- the loop ------------------------------------------------------------------------------
    def run_step(self, step: int, log: RunLog) -> dict:
        t_start = self.now()
        problems = self.steps.problems(step)
        dynamic = {}
        if self.cfg.algorithm.dynamic_sampling:  # scoring is part of generating: it decides what to draw
            samples, scored, problems, dynamic = self.generate_dynamic(step, problems)
            t_gen = self.now()
        else:
            samples = self.generate(step, problems)
            t_gen = self.now()
            scored = self.score(problems, samples)
        rewards = {s.sample_id: self.shaped(s, scored[s.sample_id].value) for s in samples}
        advantages = self.advantages(rewards, step, len(problems))
        t_score = self.now()
        stats = self.train(samples, advantages)
        check_finite(step, stats, self.run_dir)  # a NaN update stops the run before any save
        t_end = self.now()
        metrics = step_metrics(step, samples, rewards, problems, stats,
                               {"rollout_s": t_gen - t_start, "reward_s": t_score - t_gen, "train_s": t_end - t_score})
        metrics.update(reward_metrics(scored.values()))  # reward/<function> means, reward_failures
        metrics.update(dynamic)
        if self.episodes is not None:
            metrics.update(episode_metrics([self.episodes.stats.pop(s.sample_id) for s in samples],
                                           self.episodes.take_step_counters()))
        if self.cfg.algorithm.overlong_buffer:
            metrics["reward/overlong"] = sum(self.shaped(s, 0.0) for s in samples) / len(samples)
        log_failures(log, t_score, step, scored.items(), self.cfg.reward.fallback)
        log_step_events(log, step, samples, problems, t_start, t_gen, t_score, t_end, metrics,
                        self.cfg.run.log_tokens, self.t0, rewards)
        if self.completions is not None:
            log.completions(self.completions.rows(step, samples, problems, rewards, scored))
        metrics.update(self.evaluate(step))  # eval/... on the step's row, when eval.every says so
        log.metrics(metrics)
        return metrics

    def run(self, log: RunLog) -> list[dict]:
        cfg = self.cfg.run
        rows = []
        with StepProgress("train", cfg.steps, enabled=cfg.progress, completed=self.state.step) as bar, \
                interrupt.graceful(self.run_dir):
            for step in range(self.state.step, cfg.steps):
                row = self.run_step(step, log)
                rows.append(row)
                done = step + 1
                stop = interrupt.requested()  # read once: the checkpoint below is the one a stop needs
                if stop or done == cfg.steps or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0):
                    log.flush()  # the events of the steps it covers are on disk before it is
                    prune_before_save(self.run_dir, cfg.keep_checkpoints, done)  # room first: the disk may be full
                    save_checkpoint(self.run_dir, self.model, self.trainer.optimizer, self.state)
                    prune_checkpoints(self.run_dir, cfg.keep_checkpoints)
                bar.advance(reward=row["reward_mean"], len=row["response_len_mean"], tok_s=row["tokens_per_s"])
                start_up.first_step()
                if stop:
                    raise interrupt.Stopped(stop, done, checkpoint_dir(self.run_dir, done))
        return rows


def log_step_events(log: RunLog, step: int, samples, problems: list[Problem], t_start: float, t_gen: float,
                    t_score: float, t_end: float, metrics: dict, log_tokens: bool = False, t0: float = 0.0,
                    rewards: dict[SampleId, float] | None = None) -> None:
    log.event("interval", t_start, device=0, role="rollout", phase="generate", step=step, start=t_start, end=t_gen)
    log.event("interval", t_gen, device=0, role="train", phase="score+update", step=step, start=t_gen, end=t_end)
    for s in samples:
        log.event("sample", s.finish_time - t0, id=list(s.sample_id), step=step,
                  prompt_id=problems[s.sample_id[1]].uid, output_length=len(s.token_ids),
                  weights_version=s.weights_version, instance=0, submit=s.submit_time - t0, finish=s.finish_time - t0,
                  **({"reward": rewards[s.sample_id]} if rewards is not None else {}),
                  **({"tokens": list(s.token_ids), "logprobs": list(s.logprobs)} if log_tokens else {}),
                  **episode_event_fields(s, log_tokens))
    log.event("step", t_end, step=step, start=t_start, end=t_end, rollout_s=t_gen - t_start,
              train_s=t_end - t_score, sync_s=0.0, reward_mean=metrics["reward_mean"], tokens=metrics["tokens"],
              split=None, mode="colocated")


def train_colocated(cfg: TrainConfig, resume: bool = False) -> list[dict]:
    injection.current()  # a POISE_FAULTS that does not load fails here, before any work
    run_dir = prepare_run_dir(cfg, resume)
    start_up.begin(run_dir)
    try:
        loop = ColocatedLoop(cfg, run_dir)
    except BaseException:
        start_up.end()
        raise
    try:
        if resume:
            checkpoint = latest_checkpoint(run_dir)
            loop.state = load_checkpoint(checkpoint, loop.model, loop.trainer.optimizer)
            truncate_logs(run_dir, loop.state.step)  # no step logged twice
            loop.t0 = time.perf_counter() - run_clock(run_dir)  # the clock goes on from the last segment's end
            print(resume_line(run_dir, checkpoint, loop.state.step), file=sys.stderr)
        else:
            dump(cfg, run_dir / "config.yaml")
        with RunLog(run_dir, append=resume, tensorboard=cfg.run.tensorboard, wandb=cfg.run.wandb,
                    config=to_dict(cfg)) as log:
            return loop.run(log)
    finally:
        start_up.end()
        loop.steps.rewards.close()  # the reward sandbox's workers end with the run
        loop.engine.abort()  # an error mid-generation leaves sequences in flight; release needs none
        loop.engine.release()  # vLLM's process, its weights file and shared memory on /dev/shm
