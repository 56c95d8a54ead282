"""The `poise train` / `poise sft` configuration: small frozen sections, each validated.

Each component receives only its own section (STYLE.md rule 3). Load with
`load_train_config(path, overrides)`; every bad key, type or value fails here, before any work.
Torch-free, down to the engine, sampling and tiny-model sections (DESIGN.md, Layers): the driver
and emulated workers load and unpickle every section without importing torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from poise.data.tasks import Phase, validate_phases
from poise.errors import ConfigError
from poise.policy.dispatch import DispatchConfig
from poise.policy.pipeline import PipelineConfig
from poise.policy.plan import MICRO_BATCH_SIZE_HELP
from poise.schema import check, help_factory, help_field, load


@dataclass(frozen=True)
class RunConfig:
    seed: int = help_field(0, "the seed: prompts, sampling and initial weights are functions of it")
    steps: int = help_field(40, "RL steps (optimizer updates)")
    dir: str = help_field("runs/default", "run directory for config, logs and checkpoints")
    checkpoint_every: int = help_field(10, "save a checkpoint every N steps (and at the last step); 0 = last only")
    overwrite: bool = help_field(False, "allow starting fresh in a run directory that already holds a run")
    progress: bool = help_field(True, "show a live progress display")
    log_tokens: bool = help_field(False, "also write each sample's token ids and log-probs into its events.jsonl line")
    verify_sync: bool = help_field(False, "after every weight sync, check that each rollout device's weights digest "
                                          "equals the trainer's (hashes every weight: for tests and debugging)")

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
class TinyModelConfig:
    """A small decoder that trains on a 2-core CPU in minutes."""

    arch: Literal["qwen2", "llama"] = help_field("qwen2", "transformers architecture of the tiny model")
    hidden_size: int = help_field(128, "model width")
    num_layers: int = help_field(2, "decoder layers")
    num_heads: int = help_field(4, "attention heads")
    num_kv_heads: int = help_field(2, "key/value heads (grouped-query attention)")
    intermediate_size: int = help_field(256, "MLP width")
    max_positions: int = help_field(256, "longest prompt + response the model supports")

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "max_positions"):
            check(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        check(self.hidden_size % self.num_heads == 0, "hidden_size", self.hidden_size,
              f"must be a multiple of num_heads ({self.num_heads})")
        check(self.num_heads % self.num_kv_heads == 0, "num_kv_heads", self.num_kv_heads,
              f"must divide num_heads ({self.num_heads})")


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
class SamplingConfig:
    temperature: float = help_field(1.0, "softmax temperature; 0 means greedy")
    top_p: float = help_field(1.0, "nucleus sampling: keep the smallest set of tokens with this much mass")
    top_k: int = help_field(0, "keep only the k most likely tokens; 0 keeps all")
    max_new_tokens: int = help_field(80, "longest response in tokens")

    def __post_init__(self) -> None:
        check(self.temperature >= 0, "temperature", self.temperature, "must be >= 0 (0 = greedy)")
        check(0 < self.top_p <= 1, "top_p", self.top_p, "must be in (0, 1]")
        check(self.top_k >= 0, "top_k", self.top_k, "must be >= 0 (0 = no top-k)")
        check(self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, "must be >= 1")


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
    micro_batch_size: int = help_field(16, MICRO_BATCH_SIZE_HELP)
    updates_per_step: int = help_field(1, "optimizer updates per step: the step's samples, in sample-id order, "
                                          "are cut into this many mini-batches of whole groups (PPO mini-batches)")
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
        check(self.updates_per_step >= 1, "updates_per_step", self.updates_per_step, "must be >= 1")
        check(self.prompts_per_step % self.updates_per_step == 0, "updates_per_step", self.updates_per_step,
              f"must divide prompts_per_step ({self.prompts_per_step}) so each update gets whole groups")


@dataclass(frozen=True)
class EngineConfig:
    num_slots: int = help_field(32, "sequences decoded together (the continuous batch size)")
    max_context: int = help_field(0, "prompt + response tokens per slot; 0 = the model's max_position_embeddings")
    batch_invariant: bool = help_field(False, "bit-identical tokens and logprobs regardless of batch, slot and "
                                              "co-batched requests (fixed decode shapes; slower)")
    invariant_tile: int = help_field(16, "rows per fixed-shape decode tile in batch_invariant mode; engines "
                                         "must share it (and max_context) to agree bit for bit. One forward "
                                         "per tile with a live slot: set it to num_slots when every engine "
                                         "has the same slots (fewest forwards)")
    max_prefill_tokens: int = help_field(2048, "prompt tokens admitted per step at most (bounds a step's work)")
    stop_strings: tuple[str, ...] = help_field((), "a response ends once its text contains one of these "
                                                   "(needs a tokenizer); the completing token is kept")
    weight_bucket_mb: float = help_field(64.0, "load_weights stages at most this many MiB at a time")

    def __post_init__(self) -> None:
        check(self.num_slots >= 1, "num_slots", self.num_slots, "must be >= 1")
        check(self.max_context >= 0, "max_context", self.max_context, "must be >= 0 (0 = model's maximum)")
        check(self.invariant_tile >= 2, "invariant_tile", self.invariant_tile,
              "must be >= 2 (a 1-row matmul takes a different kernel than a multi-row one)")
        check(self.max_prefill_tokens >= 1, "max_prefill_tokens", self.max_prefill_tokens, "must be >= 1")
        check(all(isinstance(s, str) and s for s in self.stop_strings), "stop_strings", self.stop_strings,
              "must be non-empty strings")
        check(self.weight_bucket_mb > 0, "weight_bucket_mb", self.weight_bucket_mb, "must be > 0")


@dataclass(frozen=True)
class ClusterConfig:
    """The Ray pool of a disaggregated job (a scenario's `cluster:` is poise.sim.scenario.SimClusterConfig)."""

    devices: int = help_field(4, "devices (one worker actor each) in the job's placement group")
    device: Literal["cpu", "cuda"] = help_field("cpu", "cpu: each device is a CPU worker with "
                                                       "threads_per_device threads; cuda: one GPU per device")
    threads_per_device: int = help_field(1, "torch threads per device (pinned in bitwise mode)")
    split: tuple[int, ...] = help_field((), "[rollout devices, train devices]; empty = the allocator decides")
    address: str | None = help_field(None, "join this Ray cluster (host:port); null starts a local Ray")
    connect_timeout_s: float = help_field(20.0, "give up joining a cluster or placing devices after this long")
    compute: Literal["real", "emulated"] = help_field("real", "emulated: the same actors with engine and "
                                                              "trainer compute replaced by sleeps from the cost model")

    def __post_init__(self) -> None:
        check(self.devices >= 2, "devices", self.devices,
              "a disaggregated job needs at least 2 devices (one rollout, one train); use pipeline.mode=colocated for 1")
        check(self.threads_per_device >= 1, "threads_per_device", self.threads_per_device, "must be >= 1")
        if self.split:
            check(len(self.split) == 2, "split", list(self.split), "give [rollout devices, train devices]")
            check(min(self.split) >= 1, "split", list(self.split),
                  "both roles need at least one device, e.g. [2, 2]")
            check(sum(self.split) == self.devices, "split", list(self.split),
                  f"must add up to cluster.devices ({self.devices})")
        check(self.connect_timeout_s > 0, "connect_timeout_s", self.connect_timeout_s, "must be > 0")


@dataclass(frozen=True)
class EmulationConfig:
    """What `cluster.compute: emulated` replaces compute with (poise.runtime.emulated)."""

    scenario: str = help_field("streamrl-pipeline", "simulator scenario (built-in name or YAML path) whose workload "
                                                    "(prompts, output lengths) and cost model apply; dispatch, "
                                                    "pipeline and micro-batching are this config's")
    overrides: tuple[str, ...] = help_field((), "dotted overrides of the scenario, e.g. "
                                                "['workload.prompts_per_step=16']")
    time_scale: float = help_field(0.1, "wall seconds slept per cost-model second (0.1: a modelled 60 s step "
                                        "sleeps 6 s)")

    def __post_init__(self) -> None:
        check(self.time_scale > 0, "time_scale", self.time_scale, "must be > 0, e.g. 0.1")


@dataclass(frozen=True)
class TrainConfig:
    run: RunConfig = help_factory(RunConfig, "run-level settings")
    model: ModelConfig = help_factory(ModelConfig, "policy model")
    data: DataConfig = help_factory(DataConfig, "prompts and tokenizer")
    algorithm: AlgorithmConfig = help_factory(AlgorithmConfig, "RL algorithm")
    rollout: EngineConfig = help_factory(EngineConfig, "rollout engine (batch_invariant is forced on in "
                                                       "determinism: bitwise)")
    pipeline: PipelineConfig = help_factory(PipelineConfig, "how rollout and training are arranged")
    cluster: ClusterConfig = help_factory(ClusterConfig, "devices")
    dispatch: DispatchConfig = help_factory(DispatchConfig, "stream generation service dispatch")
    emulation: EmulationConfig = help_factory(EmulationConfig, "scenario and time scale of cluster.compute: emulated")
    determinism: Literal["bitwise", "semantic"] = help_field(
        "bitwise", "bitwise: results identical bit for bit across splits and restarts; semantic: faster")

    def __post_init__(self) -> None:
        if self.determinism == "bitwise" and not self.rollout.batch_invariant:
            # bitwise trajectories need batch-invariant decoding (DESIGN.md invariant 1)
            object.__setattr__(self, "rollout", dataclasses.replace(self.rollout, batch_invariant=True))
        # only a simulated or emulated workload knows its output lengths before generating them
        check(self.dispatch.ranker != "oracle" or self.cluster.compute == "emulated", "dispatch.ranker", "oracle",
              "needs the true output lengths, which only the simulator and cluster.compute=emulated have; "
              "use history or learned")
        s = self.algorithm.sampling
        if self.model.path is None:
            need = self.model.tiny.max_positions
            check(s.max_new_tokens < need, "algorithm.sampling.max_new_tokens", s.max_new_tokens,
                  f"must leave room for the prompt within model.tiny.max_positions ({need})")


def load_train_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    return load(TrainConfig, path, overrides)


__all__ = ["TrainConfig", "RunConfig", "ModelConfig", "TinyModelConfig", "DataConfig", "AlgorithmConfig",
           "SamplingConfig", "EngineConfig", "PipelineConfig", "ClusterConfig", "EmulationConfig", "DispatchConfig",
           "SFTConfig", "load_train_config", "ConfigError"]
