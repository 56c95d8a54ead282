"""The `poise train` / `poise sft` configuration: small frozen sections, each validated.

Each component receives only its own section (STYLE.md rule 3). Load with
`load_train_config(path, overrides)`; every bad key, type or value fails here, before any work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from poise.data.tasks import Phase, validate_phases
from poise.model.loading import TinyModelConfig
from poise.rollout.sampling import SamplingConfig
from poise.errors import ConfigError
from poise.schema import check, help_factory, help_field, load


@dataclass(frozen=True)
class RunConfig:
    seed: int = help_field(0, "the seed: prompts, sampling and initial weights are functions of it")
    steps: int = help_field(40, "RL steps (optimizer updates)")
    dir: str = help_field("runs/default", "run directory for config, logs and checkpoints")
    checkpoint_every: int = help_field(10, "save a checkpoint every N steps (and at the last step); 0 = last only")
    overwrite: bool = help_field(False, "allow starting fresh in a run directory that already holds a run")
    progress: bool = help_field(True, "show a live progress display")

    def __post_init__(self) -> None:
        check(self.steps >= 1, "steps", self.steps, "must be >= 1")
        check(self.checkpoint_every >= 0, "checkpoint_every", self.checkpoint_every, "must be >= 0")
        check(bool(self.dir), "dir", self.dir, "must name a directory")


@dataclass(frozen=True)
class SFTConfig:
    steps: int = help_field(300, "optimizer steps of supervised warm start")
    batch_size: int = help_field(64, "reference answers per step")
    lr: float = help_field(3e-3, "AdamW learning rate")
    seed: int = help_field(1, "seed of the warm start (weights init and its own prompt stream)")

    def __post_init__(self) -> None:
        check(self.steps >= 0, "steps", self.steps, "must be >= 0")
        check(self.batch_size >= 1, "batch_size", self.batch_size, "must be >= 1")
        check(self.lr > 0, "lr", self.lr, "must be > 0")


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = help_field(None, "local HF checkpoint directory (config.json + safetensors); "
                                        "null builds the tiny model from `tiny` with run.seed")
    tiny: TinyModelConfig = help_factory(TinyModelConfig, "shape of the built-in tiny model")
    sft_if_missing: bool = help_field(False, "if `path` does not exist, make it with `poise sft` first")
    sft: SFTConfig = help_factory(SFTConfig, "the warm start used by sft_if_missing and `poise sft`")


@dataclass(frozen=True)
class DataConfig:
    phases: tuple[Phase, ...] = help_field((), "task mix over training: [{mix: {arith: 0.5, span: 0.25, "
                                                "sort: 0.25}, until_step: 20}, ...]; empty = built-in mix")
    pool_size: int = help_field(512, "problems per phase, iterated in epochs")
    dataset: str | None = help_field(None, "user dataset (JSONL or Parquet: prompt, answer, reward); "
                                           "replaces the built-in tasks")
    tokenizer: str = help_field("char", "'char' (built-in), 'model' (saved beside the model) or a directory")

    def __post_init__(self) -> None:
        check(self.pool_size >= 1, "pool_size", self.pool_size, "must be >= 1")
        if self.phases:
            validate_phases(self.phases, "phases")


@dataclass(frozen=True)
class AlgorithmConfig:
    name: Literal["grpo"] = help_field("grpo", "RL algorithm")
    prompts_per_step: int = help_field(16, "prompts per step")
    group_size: int = help_field(8, "responses per prompt (G); GRPO normalises rewards within a group")
    lr: float = help_field(1e-3, "AdamW learning rate")
    weight_decay: float = help_field(0.0, "AdamW weight decay")
    max_grad_norm: float = help_field(1.0, "clip the global gradient norm; 0 disables")
    clip_eps: float = help_field(0.2, "PPO clip range epsilon")
    kl_coef: float = help_field(0.0, "weight of the k3 KL penalty to the frozen initial policy; 0 disables")
    loss_agg: Literal["token", "sequence"] = help_field(
        "token", "token: mean over all response tokens of the step; sequence: mean per response, then over responses")
    scale_rewards: bool = help_field(True, "divide group-centred rewards by the group's std (GRPO); false = Dr.GRPO")
    micro_batch_size: int = help_field(16, "samples per micro-batch (canonical order by sample id)")
    sampling: SamplingConfig = help_factory(SamplingConfig, "rollout sampling")

    def __post_init__(self) -> None:
        check(self.prompts_per_step >= 1, "prompts_per_step", self.prompts_per_step, "must be >= 1")
        check(self.group_size >= 2, "group_size", self.group_size,
              "GRPO needs at least 2 responses per prompt to normalise rewards within a group; set group_size >= 2")
        check(self.lr > 0, "lr", self.lr, "must be > 0")
        check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")
        check(self.max_grad_norm >= 0, "max_grad_norm", self.max_grad_norm, "must be >= 0 (0 disables)")
        check(0 < self.clip_eps < 1, "clip_eps", self.clip_eps, "must be in (0, 1)")
        check(self.kl_coef >= 0, "kl_coef", self.kl_coef, "must be >= 0")
        check(self.micro_batch_size >= 1, "micro_batch_size", self.micro_batch_size, "must be >= 1")


@dataclass(frozen=True)
class PipelineConfig:
    mode: Literal["colocated"] = help_field("colocated", "colocated: one process, the semantic reference")


@dataclass(frozen=True)
class ClusterConfig:
    threads_per_device: int = help_field(1, "torch threads per device (pinned in bitwise mode)")

    def __post_init__(self) -> None:
        check(self.threads_per_device >= 1, "threads_per_device", self.threads_per_device, "must be >= 1")


@dataclass(frozen=True)
class TrainConfig:
    run: RunConfig = help_factory(RunConfig, "run-level settings")
    model: ModelConfig = help_factory(ModelConfig, "policy model")
    data: DataConfig = help_factory(DataConfig, "prompts and tokenizer")
    algorithm: AlgorithmConfig = help_factory(AlgorithmConfig, "RL algorithm")
    pipeline: PipelineConfig = help_factory(PipelineConfig, "how rollout and training are arranged")
    cluster: ClusterConfig = help_factory(ClusterConfig, "devices")
    determinism: Literal["bitwise", "semantic"] = help_field(
        "bitwise", "bitwise: results identical bit for bit across splits and restarts; semantic: faster")

    def __post_init__(self) -> None:
        s = self.algorithm.sampling
        if self.model.path is None:
            need = self.model.tiny.max_positions
            check(s.max_new_tokens < need, "algorithm.sampling.max_new_tokens", s.max_new_tokens,
                  f"must leave room for the prompt within model.tiny.max_positions ({need})")


def load_train_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    return load(TrainConfig, path, overrides)


__all__ = ["TrainConfig", "RunConfig", "ModelConfig", "DataConfig", "AlgorithmConfig", "PipelineConfig",
           "ClusterConfig", "SFTConfig", "load_train_config", "ConfigError"]
