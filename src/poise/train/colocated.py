"""The colocated GRPO loop: one process, the semantic reference for every distributed mode.

Each step: the prompts of step k (a function of seed and k), G responses each under weights
version k, exact rewards, group-normalised advantages, one update -> version k + 1.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from poise.algo.losses import group_advantages
from poise.config import TrainConfig
from poise.data.tasks import Problem, reward
from poise.errors import PoiseError
from poise.policy.cost import percentile
from poise.rollout.engine import Engine, Request
from poise.runlog import RunLog
from poise.schema import dump
from poise.train.checkpoint import TrainState, latest_checkpoint, load_checkpoint, save_checkpoint
from poise.train.progress import StepProgress
from poise.train.setup import encode_prompt, make_model, make_prompt_source, make_tokenizer, pin_threads
from poise.train.trainer import PolicyTrainer

SampleId = tuple[int, int, int]


@dataclass
class StepResult:
    rewards: dict[SampleId, float]
    metrics: dict


class ColocatedLoop:
    def __init__(self, cfg: TrainConfig, run_dir: Path):
        self.cfg = cfg
        self.run_dir = run_dir
        algo = cfg.algorithm
        pin_threads(cfg.cluster.threads_per_device, cfg.determinism == "bitwise")
        torch.manual_seed(cfg.run.seed)
        self.tokenizer = make_tokenizer(cfg.data, cfg.model)
        self.source = make_prompt_source(cfg.data, cfg.run.seed)
        self.model = make_model(cfg, self.tokenizer, progress=cfg.run.progress)
        ref = None
        if algo.kl_coef > 0:
            ref = make_model(cfg, self.tokenizer, progress=False).requires_grad_(False).eval()
        self.trainer = PolicyTrainer(self.model, algo, self.tokenizer.pad_id, ref)
        # The engine runs the trainer's own modules: colocated weights need no sync.
        self.engine = Engine(self.model, cfg.rollout, algo.sampling, cfg.run.seed, self.tokenizer.eos_id)
        self.state = TrainState(step=0, weights_version=0)
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    # --- the phases of one step -------------------------------------------------------------
    def generate(self, step: int, problems: list[Problem]):
        g = self.cfg.algorithm.group_size
        self.engine.set_weights_version(self.state.weights_version)
        return self.engine.generate(Request((step, i, j), encode_prompt(self.tokenizer, p))
                                    for i, p in enumerate(problems) for j in range(g))

    def score(self, problems: list[Problem], samples) -> dict[SampleId, float]:
        eos = self.tokenizer.eos_id
        return {s.sample_id: reward(problems[s.sample_id[1]],
                                    self.tokenizer.decode([t for t in s.token_ids if t != eos]))
                for s in samples}

    def advantages(self, rewards: dict[SampleId, float], step: int, n_prompts: int) -> dict[SampleId, float]:
        g = self.cfg.algorithm.group_size
        table = torch.tensor([[rewards[(step, i, j)] for j in range(g)] for i in range(n_prompts)],
                             dtype=torch.float32)
        adv = group_advantages(table, scale=self.cfg.algorithm.scale_rewards)
        return {(step, i, j): float(adv[i, j]) for i in range(n_prompts) for j in range(g)}

    def train(self, samples, advantages: dict[SampleId, float]) -> dict:
        stats = self.trainer.train_step(samples, advantages)
        self.state = TrainState(self.state.step + 1, self.state.weights_version + 1)
        return stats

    # --- the loop ------------------------------------------------------------------------------
    def run_step(self, step: int, log: RunLog) -> dict:
        t_start = self.now()
        problems = self.source.prompts_for_step(step, self.cfg.algorithm.prompts_per_step)
        samples = self.generate(step, problems)
        t_gen = self.now()
        rewards = self.score(problems, samples)
        advantages = self.advantages(rewards, step, len(problems))
        t_score = self.now()
        stats = self.train(samples, advantages)
        t_end = self.now()
        metrics = step_metrics(step, samples, rewards, problems, stats,
                               {"rollout_s": t_gen - t_start, "reward_s": t_score - t_gen, "train_s": t_end - t_score})
        log_step_events(log, step, samples, problems, t_start, t_gen, t_score, t_end, metrics,
                        self.cfg.run.log_tokens)
        log.metrics(metrics)
        return metrics

    def run(self, log: RunLog) -> list[dict]:
        cfg = self.cfg.run
        rows = []
        with StepProgress("train", cfg.steps, enabled=cfg.progress, completed=self.state.step) as bar:
            for step in range(self.state.step, cfg.steps):
                row = self.run_step(step, log)
                rows.append(row)
                done = step + 1
                if done == cfg.steps or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0):
                    save_checkpoint(self.run_dir, self.model, self.trainer.optimizer, self.state)
                bar.advance(reward=row["reward_mean"], len=row["response_len_mean"], tok_s=row["tokens_per_s"])
        return rows


def step_metrics(step: int, samples, rewards: dict[SampleId, float], problems: list[Problem], stats: dict,
                 phases: dict[str, float]) -> dict:
    lengths = [len(s.token_ids) for s in samples]
    step_s = sum(phases.values())
    by_family: dict[str, list[float]] = {}
    for s in samples:
        by_family.setdefault(problems[s.sample_id[1]].family, []).append(rewards[s.sample_id])
    return {
        "step": step,
        "reward_mean": sum(rewards.values()) / len(rewards),
        "reward_by_family": {f: sum(v) / len(v) for f, v in sorted(by_family.items())},
        "response_len_mean": sum(lengths) / len(lengths),
        "response_len_p50": percentile(lengths, 0.5),
        "response_len_p99": percentile(lengths, 0.99),
        "response_len_max": max(lengths),
        "tokens": sum(lengths),
        "step_s": step_s,
        "phases": phases,
        "tokens_per_s": sum(lengths) / step_s if step_s > 0 else 0.0,
        "weights_version": samples[0].weights_version,
        **stats,
    }


def log_step_events(log: RunLog, step: int, samples, problems: list[Problem], t_start: float, t_gen: float,
                    t_score: float, t_end: float, metrics: dict, log_tokens: bool = False) -> None:
    log.event("interval", t_start, device=0, role="rollout", phase="generate", step=step, start=t_start, end=t_gen)
    log.event("interval", t_gen, device=0, role="train", phase="score+update", step=step, start=t_gen, end=t_end)
    for s in samples:
        log.event("sample", t_gen, id=list(s.sample_id), step=step, prompt_id=problems[s.sample_id[1]].uid,
                  output_length=len(s.token_ids), weights_version=s.weights_version, instance=0, submit=t_start,
                  finish=t_gen, **({"tokens": list(s.token_ids)} if log_tokens else {}))
    log.event("step", t_end, step=step, start=t_start, end=t_end, rollout_s=t_gen - t_start,
              train_s=t_end - t_score, sync_s=0.0, reward_mean=metrics["reward_mean"], tokens=metrics["tokens"],
              split=None, mode="colocated")


def prepare_run_dir(cfg: TrainConfig, resume: bool) -> Path:
    run_dir = Path(cfg.run.dir)
    has_run = (run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists()
    if has_run and not resume:
        if not cfg.run.overwrite:
            raise PoiseError(f"run directory '{run_dir}' already holds a run; resume it with --resume {run_dir}, "
                             "choose another run.dir, or set run.overwrite=true")
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def train_colocated(cfg: TrainConfig, resume: bool = False) -> list[dict]:
    run_dir = prepare_run_dir(cfg, resume)
    loop = ColocatedLoop(cfg, run_dir)
    if resume:
        loop.state = load_checkpoint(latest_checkpoint(run_dir), loop.model, loop.trainer.optimizer)
        truncate_metrics(run_dir, loop.state.step)
    else:
        dump(cfg, run_dir / "config.yaml")
    with RunLog(run_dir, append=resume) as log:
        return loop.run(log)


def truncate_metrics(run_dir: Path, steps_done: int) -> None:
    """Drop metrics rows of steps after the checkpoint: they will be recomputed identically."""
    import json

    path = run_dir / "metrics.jsonl"
    if path.exists():
        rows = [line for line in path.read_text().splitlines() if line.strip()]
        kept = [r for r in rows if json.loads(r)["step"] < steps_done]
        path.write_text("".join(r + "\n" for r in kept))
