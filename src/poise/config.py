"""The `poise train` / `poise sft` configuration: small frozen sections, each validated.

Each component receives only its own section (STYLE.md rule 3). Load with
`load_train_config(path, overrides)`; every bad key, type or value fails here, before any work.
Torch-free, down to the engine, sampling and tiny-model sections (docs/design.md, Layers): the driver
and emulated workers load and unpickle every section without importing torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from poise.data.tasks import Phase, validate_phases
from poise.errors import ConfigError
from poise.model.files import model_dir_problem
from poise.policy.controller import ControllerConfig, ResizeConfig
from poise.policy.dispatch import DispatchConfig
from poise.policy.pipeline import PipelineConfig
from poise.policy.plan import MICRO_BATCH_SIZE_HELP
from poise.policy.scale import ScaleConfig
from poise.policy.split import parse_splits
from poise.rewards.builtin import BUILTINS as REWARD_BUILTINS
from poise.schema import apply_overrides, build, check, help_factory, help_field, read_yaml

AUTO_EMULATED_PROCESSES = 16  # emulation.devices_per_process auto: at most this many actor processes


@dataclass(frozen=True)
class WandbConfig:
    """Weights & Biases logging of a run (`run.wandb`): the same scalars as TensorBoard."""

    project: str = help_field("poise", "W&B project")
    name: str = help_field("", "W&B run name; empty = the run directory's name")
    mode: Literal["online", "offline"] = help_field(
        "online", "online: stream to the W&B server (needs WANDB_API_KEY or `wandb login`); offline: write "
                  "RUN_DIR/wandb/ only, no network (`wandb sync` uploads it later)")

    def __post_init__(self) -> None:
        check(bool(self.project.strip()), "project", self.project, "must name a W&B project")


@dataclass(frozen=True)
class RunConfig:
    seed: int = help_field(0, "the seed: prompts, sampling and initial weights are functions of it")
    steps: int = help_field(40, "RL steps (optimizer updates)")
    dir: str = help_field("runs/default", "run directory for config, logs and checkpoints")
    checkpoint_every: int = help_field(10, "save a checkpoint every N steps (and at the last step); 0 = last only")
    keep_checkpoints: int = help_field(0, "keep only the newest N checkpoints: the older ones go before each save "
                                          "(so a smaller N frees a full disk's room; the newest stays) and after "
                                          "it; 0 = keep all (the default, as HF Trainer's save_total_limit: "
                                          "nothing is deleted unless asked)")
    overwrite: bool = help_field(False, "allow starting fresh in a run directory that already holds a run")
    progress: bool = help_field(True, "show a live progress display")
    log_tokens: bool = help_field(False, "also write each sample's token ids and log-probs into its events.jsonl line")
    log_completions: int = help_field(4, "samples per step written as text (prompt, completion, rewards) to "
                                         "RUN_DIR/completions.jsonl, chosen by sample id; `poise completions` "
                                         "shows them; 0 = off")
    verify_sync: bool = help_field(False, "after every weight sync, check that each rollout device's weights digest "
                                          "equals the trainer's (hashes every weight: for tests and debugging)")
    tensorboard: bool = help_field(False, "also write each metrics row's numbers as TensorBoard scalars into "
                                          "RUN_DIR/tensorboard/ (needs the tensorboard package)")
    wandb: WandbConfig | None = help_field(None, "also log each metrics row's numbers to Weights & Biases: "
                                                 "{project, name, mode}; null = off (needs the wandb package)")

    def __post_init__(self) -> None:
        check(self.steps >= 1, "steps", self.steps, "must be >= 1")
        check(self.checkpoint_every >= 0, "checkpoint_every", self.checkpoint_every, "must be >= 0")
        check(self.keep_checkpoints >= 0, "keep_checkpoints", self.keep_checkpoints, "must be >= 0 (0 = keep all)")
        check(self.log_completions >= 0, "log_completions", self.log_completions, "must be >= 0 (0 = off)")
        check(bool(self.dir), "dir", self.dir, "must name a directory")


@dataclass(frozen=True)
class SFTConfig:
    steps: int = help_field(300, "optimizer steps of supervised warm start")
    batch_size: int = help_field(64, "reference answers per step")
    lr: float = help_field(3e-3, "AdamW learning rate")
    seed: int = help_field(1, "seed of the warm start (weights init and its own prompt stream)")
    threads: int = help_field(1, "torch threads of the warm start (one process; its bytes depend on the count)")

    def __post_init__(self) -> None:
        check(self.steps >= 0, "steps", self.steps, "must be >= 0")
        check(self.threads >= 1, "threads", self.threads, "must be >= 1")
        check(self.batch_size >= 1, "batch_size", self.batch_size, "must be >= 1")
        check(self.lr > 0, "lr", self.lr, "must be > 0")


@dataclass(frozen=True)
class TinyModelConfig:
    """A small decoder that trains on a 2-core CPU in minutes."""

    arch: Literal["qwen2", "llama", "qwen3", "mistral"] = help_field(
        "qwen2", "transformers architecture of the tiny model")
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


# The linear projections of a decoder layer of every family the engine runs (Llama, Qwen2, Qwen3,
# Mistral): the modules LoRA may adapt (the engine applies an adapter on these alone).
LORA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters (via peft) on the decoder layers' projections: the base weights stay frozen,
    only the adapters train (their AdamW state is all the optimizer holds)."""

    r: int = help_field(8, "adapter rank")
    alpha: float = help_field(16.0, "scale numerator: an adapter adds alpha / r * B @ A to its projection")
    dropout: float = help_field(0.0, "dropout on the adapter's input while training; > 0 needs determinism: "
                                     "semantic (its randomness is not a function of the sample id)")
    target_modules: tuple[str, ...] = help_field(LORA_PROJECTIONS, "the projections to adapt, by name, in every "
                                                                   "decoder layer")

    def __post_init__(self) -> None:
        check(self.r >= 1, "r", self.r, "must be >= 1")
        check(self.alpha > 0, "alpha", self.alpha, "must be > 0 (the adapter's scale is alpha / r)")
        check(0 <= self.dropout < 1, "dropout", self.dropout, "must be in [0, 1)")
        check(len(self.target_modules) >= 1, "target_modules", list(self.target_modules),
              f"must name at least one of the model's projections: {', '.join(LORA_PROJECTIONS)}")
        for name in self.target_modules:
            check(name in LORA_PROJECTIONS, "target_modules", name,
                  f"is not a projection of the model's decoder layers; choose from {', '.join(LORA_PROJECTIONS)}")
        check(len(set(self.target_modules)) == len(self.target_modules), "target_modules",
              list(self.target_modules), "names a module twice")


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = help_field(None, "local HF checkpoint directory (config.json + safetensors); "
                                        "null builds the tiny model from `tiny` with run.seed")
    tiny: TinyModelConfig = help_factory(TinyModelConfig, "shape of the built-in tiny model")
    sft_if_missing: bool = help_field(False, "if `path` does not exist, make it with `poise sft` first")
    dtype: Literal["float32", "bfloat16"] = help_field(
        "float32", "compute dtype of the trainer and the engine (weights, activations, KV cache, weight sync); "
                   "bfloat16 keeps fp32 master weights and AdamW state, starting from the weights rounded to "
                   "bfloat16; bitwise holds within one dtype")
    sft: SFTConfig = help_factory(SFTConfig, "the warm start used by sft_if_missing and `poise sft`")
    lora: LoraConfig | None = help_field(None, "train LoRA adapters instead of every weight: {r, alpha, dropout, "
                                               "target_modules}; null = full fine-tuning (needs the peft package: "
                                               "pip install 'poise[lora]')")

    def __post_init__(self) -> None:
        problem = None if self.path is None else model_dir_problem(self.path)
        check(problem is None, "path", self.path, problem or "")


@dataclass(frozen=True)
class DataConfig:
    phases: tuple[Phase, ...] = help_field((), "task mix over training: [{mix: {arith: 0.5, span: 0.25, "
                                                "sort: 0.25}, until_step: 20}, ...]; empty = built-in mix")
    pool_size: int = help_field(512, "problems per phase, iterated in epochs")
    dataset: str | None = help_field(None, "user dataset: a .jsonl or .parquet file or a `datasets` "
                                           "save_to_disk directory; replaces the built-in tasks")
    prompt_key: str = help_field("prompt", "dataset column holding the prompt (GSM8K: question)")
    answer_key: str = help_field("answer", "dataset column holding the reference answer; every other column "
                                           "is kept with its row for the reward functions")
    tokenizer: str = help_field("char", "'char' (built-in), 'model' (saved beside the model) or a directory")
    chat_template: bool = help_field(False, "format each prompt as a user message with the HF tokenizer's "
                                            "chat template (and its generation prompt)")
    system_prompt: str | None = help_field(None, "a system message before each prompt (needs chat_template)")

    def __post_init__(self) -> None:
        check(self.pool_size >= 1, "pool_size", self.pool_size, "must be >= 1")
        check(bool(self.prompt_key), "prompt_key", self.prompt_key, "must name a dataset column")
        check(bool(self.answer_key), "answer_key", self.answer_key, "must name a dataset column")
        check(self.answer_key != self.prompt_key, "answer_key", self.answer_key,
              "must differ from data.prompt_key; name the column of reference answers")
        check(not self.chat_template or self.tokenizer != "char", "chat_template", True,
              "the built-in char tokenizer has no chat template; set data.tokenizer to 'model' or an HF "
              "tokenizer directory, or data.chat_template=false")
        check(self.system_prompt is None or self.chat_template, "system_prompt", self.system_prompt,
              "is part of the chat template; set data.chat_template=true or drop system_prompt")
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


# What `algorithm.loss` sets, knob by knob, where the config leaves the knob null; a knob a preset
# does not name takes the grpo default (clip_eps both sides, token ratio, loss_agg token, advantage grpo).
LOSS_PRESETS: dict[str, dict[str, float | str]] = {
    "grpo": {},
    # Yu et al. 2025: decoupled clip (eps_low 0.2, eps_high 0.28), token-level loss. Its dynamic sampling
    # and overlong reward shaping are not part of the preset.
    "dapo": {"clip_eps_low": 0.2, "clip_eps_high": 0.28, "loss_agg": "token"},
    # Liu et al. 2025: no std in the advantage, a constant normaliser instead of each response's length
    "dr_grpo": {"advantage": "dr_grpo", "loss_agg": "constant"},
    # Zheng et al. 2025: sequence-level ratio, clipped as a whole with the paper's ranges, averaged per response
    "gspo": {"ratio_level": "sequence", "loss_agg": "sequence", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4},
}


@dataclass(frozen=True)
class AlgorithmConfig:
    name: Literal["grpo"] = help_field("grpo", "RL algorithm")
    prompts_per_step: int = help_field(16, "prompts per step")
    group_size: int = help_field(8, "responses per prompt (G); GRPO normalises rewards within a group")
    lr: float = help_field(1e-3, "AdamW learning rate")
    weight_decay: float = help_field(0.0, "AdamW weight decay")
    max_grad_norm: float = help_field(1.0, "clip the global gradient norm; 0 disables")
    loss: Literal["grpo", "dapo", "dr_grpo", "gspo"] = help_field(
        "grpo", "preset of the loss knobs left unset (null) below: grpo (clip_eps both sides, loss_agg token, "
                "advantage grpo); dapo (clip 0.2 low / 0.28 high); dr_grpo (advantage dr_grpo, loss_agg "
                "constant); gspo (ratio_level sequence, loss_agg sequence, clip 3e-4 low / 4e-4 high). A knob "
                "you set wins over its preset")
    clip_eps: float = help_field(0.2, "PPO clip range epsilon, both sides (clip_eps_low/high, if set or preset, "
                                      "replace it)")
    clip_eps_low: float | None = help_field(None, "the ratio is clipped below at 1 - clip_eps_low; null = the "
                                                  "preset's (grpo: clip_eps)")
    clip_eps_high: float | None = help_field(None, "the ratio is clipped above at 1 + clip_eps_high (DAPO's "
                                                   "clip-higher: above clip_eps_low); null = the preset's "
                                                   "(grpo: clip_eps)")
    ratio_level: Literal["token", "sequence"] | None = help_field(
        None, "token: each token's own ratio (PPO, GRPO); sequence: each response's length-normalised "
              "sequence ratio, clipped as a whole (GSPO); null = the preset's")
    kl_coef: float = help_field(0.0, "weight of the KL penalty to the frozen initial policy (TRL's beta); "
                                     "0 disables")
    kl_estimator: Literal["k1", "k2", "k3"] = help_field(
        "k3", "estimator of the KL penalty per token: k1 = logp - ref, k2 = (logp - ref)^2 / 2, "
              "k3 = exp(ref - logp) - (ref - logp) - 1 (GRPO's)")
    entropy_coef: float = help_field(0.0, "weight of an entropy bonus: the loss minus entropy_coef times each "
                                          "response token's policy entropy (aggregated like the loss); 0 disables")
    loss_agg: Literal["token", "sequence", "sequence_sum", "constant"] | None = help_field(
        None, "how per-token losses become the step's loss. token: mean over all response tokens of the step "
              "(DAPO; verl token-mean); sequence: mean per response, then over responses (GRPO paper; verl "
              "seq-mean-token-mean); sequence_sum: sum per response, mean over responses (verl "
              "seq-mean-token-sum); constant: sum over tokens / (responses x sampling.max_new_tokens) "
              "(Dr. GRPO; TRL dr_grpo); null = the preset's")
    advantage: Literal["grpo", "grpo_batch", "dr_grpo", "rloo", "reinforce_pp"] | None = help_field(
        None, "outcome advantage of each response: grpo (centred in its group, divided by the group's std); "
              "grpo_batch (centred in its group, divided by the std of every reward of the step: TRL's "
              "scale_rewards batch; training waits for every reward of the step); dr_grpo (centred only); rloo "
              "(minus the mean of the group's other rewards); reinforce_pp (centred in its group, then divided "
              "by the std of the step's centred values: training waits for every reward of the step); null = "
              "the preset's, or what scale_rewards names")
    scale_rewards: bool | Literal["group", "batch", "none"] = help_field(
        True, "TRL's spelling of algorithm.advantage: true or group = advantage grpo, batch = grpo_batch, "
              "false or none = dr_grpo")
    std_eps: float = help_field(1e-6, "added to the std that grpo, grpo_batch and reinforce_pp divide by (TRL "
                                      "adds 1e-4: set 1e-4 to match it)")
    dynamic_sampling: bool = help_field(False, "DAPO's dynamic sampling: a prompt group whose rewards are all equal "
                                               "(no advantage) is dropped as soon as it is scored and another prompt "
                                               "is drawn in its place, until the step has prompts_per_step groups "
                                               "that teach something (extra prompts: a function of seed, step and "
                                               "draw index, so every split trains on the same ones)")
    max_prompt_draws: int = help_field(0, "with dynamic_sampling, prompt groups a step may generate at most, kept "
                                          "and dropped (verl's max_num_gen_batches x batch); once spent, the "
                                          "earliest dropped groups fill the step; 0 = 4 x prompts_per_step")
    overlong_buffer: int = help_field(0, "DAPO's overlong reward shaping: a response longer than "
                                         "sampling.max_new_tokens - overlong_buffer tokens loses up to "
                                         "overlong_penalty of reward, linearly in the tokens past that mark; "
                                         "0 disables")
    overlong_penalty: float = help_field(1.0, "the reward a response of max_new_tokens tokens loses with "
                                              "overlong_buffer > 0")
    micro_batch_size: int = help_field(16, MICRO_BATCH_SIZE_HELP)
    updates_per_step: int = help_field(1, "optimizer updates per step: the step's samples, in sample-id order, "
                                          "are cut into this many mini-batches of whole groups (PPO mini-batches)")
    old_logprobs: Literal["rollout", "recompute"] = help_field(
        "rollout", "the PPO ratio's old log-probs. rollout: the rollout engine's, which come with each sample "
                   "(exact where engine and trainer agree bit for bit, as Poise's engine in fp32); recompute: "
                   "the trainer's own under the step-start weights, as verl recomputes them, so another backend "
                   "(vLLM) or bf16 leaves the first update's ratio at exactly 1 (departure from verl: the first "
                   "mini-batch's are its own forward's, detached, not a separate forward; with updates_per_step > 1 "
                   "each train device keeps a copy of the step-start weights for the later mini-batches, one more "
                   "forward each). In async "
                   "mode the samples come from the weights one update older: recompute makes the trainer's "
                   "current weights the proximal policy (decoupled PPO, as AReaL and verl) and rollout_is "
                   "corrects behaviour -> proximal")
    rollout_is: Literal["none", "token", "sequence"] = help_field(
        "none", "truncated importance sampling of the rollout/trainer mismatch (TIS, Yao et al. 2025; verl's "
                "rollout_is): each token's clipped surrogate (not the KL or entropy terms) times a weight "
                "without gradient. token: min(exp(old - rollout logp), rollout_is_cap) per token; sequence: "
                "min(exp(sum over the response of (old - rollout logp)), rollout_is_cap) for all its tokens. "
                "Needs old_logprobs recompute")
    rollout_is_cap: float = help_field(2.0, "the largest rollout_is weight (truncation); must be >= 1")
    gradient_checkpointing: bool = help_field(False, "recompute each decoder layer's activations in the backward "
                                                     "pass instead of keeping them (less memory, ~1/3 more "
                                                     "compute; the same bits)")
    sampling: SamplingConfig = help_factory(SamplingConfig, "rollout sampling")

    def __post_init__(self) -> None:
        check(self.prompts_per_step >= 1, "prompts_per_step", self.prompts_per_step, "must be >= 1")
        check(self.group_size >= 2, "group_size", self.group_size,
              "GRPO needs at least 2 responses per prompt to normalise rewards within a group; set group_size >= 2")
        check(self.lr > 0, "lr", self.lr, "must be > 0")
        check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")
        check(self.max_grad_norm >= 0, "max_grad_norm", self.max_grad_norm, "must be >= 0 (0 disables)")
        check(0 < self.clip_eps < 1, "clip_eps", self.clip_eps, "must be in (0, 1)")
        check(0 < self.std_eps <= 1, "std_eps", self.std_eps, "must be in (0, 1], e.g. 1e-6 (TRL: 1e-4)")
        self._resolve_loss_preset()
        check(0 < self.clip_eps_low < 1, "clip_eps_low", self.clip_eps_low, "must be in (0, 1), e.g. 0.2")
        check(self.clip_eps_high >= self.clip_eps_low, "clip_eps_high", self.clip_eps_high,
              f"must be >= clip_eps_low ({self.clip_eps_low}): clip-higher widens the upper side, e.g. 0.28")
        check(self.entropy_coef >= 0, "entropy_coef", self.entropy_coef, "must be >= 0 (0 disables)")
        check(self.kl_coef >= 0, "kl_coef", self.kl_coef, "must be >= 0")
        check(self.max_prompt_draws == 0 or self.max_prompt_draws >= self.prompts_per_step, "max_prompt_draws",
              self.max_prompt_draws, f"must be 0 (= 4 x prompts_per_step) or >= prompts_per_step "
                                     f"({self.prompts_per_step})")
        check(0 <= self.overlong_buffer < self.sampling.max_new_tokens, "overlong_buffer", self.overlong_buffer,
              f"must be in [0, sampling.max_new_tokens) = [0, {self.sampling.max_new_tokens}); 0 disables")
        check(self.overlong_penalty >= 0, "overlong_penalty", self.overlong_penalty, "must be >= 0")
        check(self.micro_batch_size >= 1, "micro_batch_size", self.micro_batch_size, "must be >= 1")
        check(self.updates_per_step >= 1, "updates_per_step", self.updates_per_step, "must be >= 1")
        check(self.prompts_per_step % self.updates_per_step == 0, "updates_per_step", self.updates_per_step,
              f"must divide prompts_per_step ({self.prompts_per_step}) so each update gets whole groups")
        check(self.rollout_is == "none" or self.old_logprobs == "recompute", "rollout_is", self.rollout_is,
              "needs algorithm.old_logprobs=recompute: with old_logprobs rollout every weight is exactly 1; set "
              "it, or rollout_is=none")
        check(self.rollout_is_cap >= 1 and math.isfinite(self.rollout_is_cap), "rollout_is_cap",
              self.rollout_is_cap, "must be >= 1 (a finite truncation), e.g. 2.0")

    def _resolve_loss_preset(self) -> None:
        """Fill each loss knob left null from the `loss` preset (a knob set explicitly wins), so the
        resolved config (RUN_DIR/config.yaml) names every knob and loads back to the same run."""
        preset = LOSS_PRESETS[self.loss]
        scale = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)
        named = {"none": "dr_grpo", "batch": "grpo_batch"}.get(scale)  # what a scale_rewards other than group spells
        check(named is None or self.advantage in (None, named, "rloo", "reinforce_pp"), "scale_rewards",
              self.scale_rewards, f"means advantage {named}, but algorithm.advantage is {self.advantage}; drop one "
                                  "of them")
        values = {
            "clip_eps_low": self.clip_eps_low if self.clip_eps_low is not None else preset.get("clip_eps_low",
                                                                                             self.clip_eps),
            "clip_eps_high": self.clip_eps_high if self.clip_eps_high is not None else preset.get("clip_eps_high",
                                                                                                self.clip_eps),
            "ratio_level": self.ratio_level or preset.get("ratio_level", "token"),
            "loss_agg": self.loss_agg or preset.get("loss_agg", "token"),
            "advantage": self.advantage or named or preset.get("advantage", "grpo"),
        }
        values["scale_rewards"] = "batch" if values["advantage"] == "grpo_batch" else values["advantage"] == "grpo"
        for name, value in values.items():
            object.__setattr__(self, name, value)


def config_notes(cfg: TrainConfig) -> list[str]:
    """One line each for a setting that is valid but does less than its name says (printed before
    any work): a full shard over one train device holds the whole model there."""
    notes = []
    split, resizes = cfg.cluster.split, bool(cfg.resize.schedule) or cfg.resize.policy != "static"
    train = split[1] if split else (1 if cfg.cluster.devices == 2 else 0)  # 0: the allocator decides
    if cfg.cluster.shard == "full" and cfg.pipeline.mode != "colocated" and train == 1 and not resizes:
        notes.append(f"poise: note: cluster.shard=full with one train device (split {list(split) or [1, 1]}) "
                     "shards nothing: that device holds the whole model; give train 2+ devices, or set "
                     "cluster.shard=none")
    return notes


def _installed(package: str) -> bool:
    """Whether this Python can import `package` (a finder that refuses it counts as missing)."""
    import importlib.util

    try:
        return importlib.util.find_spec(package) is not None
    except ImportError:
        return False


def preset_filled_knobs(algo: AlgorithmConfig) -> frozenset[str]:
    """The loss knobs of `algo` that hold what its `loss` preset gives them (set or not): a written-out
    template leaves these null, so changing `loss` in it applies the new preset instead of pinning
    this one's values under the new name. `scale_rewards` is not among them: its false only spells
    advantage dr_grpo, which `advantage` carries."""
    knobs = ("clip_eps_low", "clip_eps_high", "ratio_level", "loss_agg", "advantage")
    base = dataclasses.replace(algo, scale_rewards=True, **{k: None for k in knobs})
    return frozenset(k for k in knobs if getattr(base, k) == getattr(algo, k))


@dataclass(frozen=True)
class EngineConfig:
    backend: Literal["poise", "vllm"] = help_field(
        "poise", "poise: Poise's engine (bit-exact with batch_invariant; the default, and what CPU runs want); "
                 "vllm: vLLM (paged KV cache, prefix sharing, CUDA graphs: what GPU runs want), needs "
                 "determinism: semantic and the vllm extra (make vllm)")
    num_slots: int = help_field(32, "sequences decoded together (the continuous batch size)")
    max_context: int = help_field(0, "prompt + response tokens per slot; 0 = what the run needs: its longest "
                                     "prompt + max_new_tokens, rounded up to a power of two, at most the model's "
                                     "max_position_embeddings (an engine built without a run: the model's maximum)")
    batch_invariant: bool = help_field(False, "bit-identical tokens and logprobs regardless of batch, slot and "
                                              "co-batched requests (fixed reduction orders: on CPU about the "
                                              "fast mode's cost; fixed-shape tiles on CUDA, slower)")
    invariant_tile: int = help_field(16, "rows per fixed-shape decode tile, used by batch_invariant where the "
                                         "matmul has no row quantum (CUDA); engines must share it (and "
                                         "max_context) to agree bit for bit. One forward per tile with a live "
                                         "slot: set it to num_slots when every engine has the same slots")
    max_prefill_tokens: int = help_field(2048, "prompt tokens admitted per step at most (bounds a step's work)")
    stop_strings: tuple[str, ...] = help_field((), "a response ends once its text contains one of these "
                                                   "(needs a tokenizer); the completing token is kept")
    weight_bucket_mb: float = help_field(64.0, "load_weights stages at most this many MiB at a time")
    kv_cache_gb: float = help_field(0.0, "largest KV cache of one engine, in GiB: an engine runs fewer than "
                                         "num_slots slots to fit it (never a shorter context); 0 = no limit")

    def __post_init__(self) -> None:
        check(self.num_slots >= 1, "num_slots", self.num_slots, "must be >= 1")
        check(self.max_context >= 0, "max_context", self.max_context, "must be >= 0 (0 = model's maximum)")
        check(self.invariant_tile >= 2, "invariant_tile", self.invariant_tile,
              "must be >= 2 (a 1-row matmul takes a different kernel than a multi-row one)")
        check(self.max_prefill_tokens >= 1, "max_prefill_tokens", self.max_prefill_tokens, "must be >= 1")
        check(all(isinstance(s, str) and s for s in self.stop_strings), "stop_strings", self.stop_strings,
              "must be non-empty strings")
        check(self.weight_bucket_mb > 0, "weight_bucket_mb", self.weight_bucket_mb, "must be > 0")
        check(self.kv_cache_gb >= 0 and math.isfinite(self.kv_cache_gb), "kv_cache_gb", self.kv_cache_gb,
              "must be >= 0 GiB (0 = no limit), e.g. 20")


@dataclass(frozen=True)
class ClusterConfig:
    """The Ray pool of a disaggregated job (a scenario's `cluster:` is poise.sim.scenario.SimClusterConfig)."""

    devices: int = help_field(4, "devices (one worker actor each) in the job's placement group")
    device: Literal["cpu", "cuda"] = help_field("cpu", "cpu: each device is a CPU worker with "
                                                       "threads_per_device threads; cuda: one GPU per device")
    threads_per_device: int = help_field(1, "torch threads per device (pinned in bitwise mode)")
    gpus_per_device: float = help_field(1.0, "cuda: the share of a GPU each device holds; below 1 several devices "
                                             "share one GPU (0.5: two per GPU, for a one-GPU machine) and their "
                                             "collectives go over gloo, since NCCL refuses two ranks on one GPU")
    split: tuple[int, ...] = help_field((), "[rollout devices, train devices]; empty = the allocator decides")
    address: str | None = help_field(None, "join this Ray cluster (host:port); null starts a local Ray")
    connect_timeout_s: float = help_field(20.0, "give up joining a cluster or placing devices after this long")
    compute: Literal["real", "emulated"] = help_field("real", "emulated: the same actors with engine and "
                                                              "trainer compute replaced by sleeps from the cost model")
    profile: str | None = help_field(None, "a `poise profile` JSON of this machine: the resize controller's "
                                     "cost model on real compute (default: the built-in model, calibrated "
                                     "to the measured step phases)")
    reserve_devices: int = help_field(0, "devices placed at start in a second placement group, idle, that may "
                                         "join the job as rollout instances (scale:)")
    step_timeout_s: float = help_field(600.0, "deadline of every wait on a device, restarted by each result that "
                                              "arrives (a generation with no finished sample or engine step, a "
                                              "micro-batch, an update, a weight sync, a checkpoint) and of gloo "
                                              "collectives; a device silent that long stops the run with one line")
    storage: Literal["auto", "shared", "driver"] = help_field(
        "auto", "how devices reach the driver's run.dir for checkpoints: auto probes each Ray node (one that "
                "does not see run.dir sends and receives checkpoints through the driver), shared trusts every "
                "node to see it, driver sends every checkpoint byte through the driver")
    shard: Literal["none", "optimizer", "full"] = help_field(
        "none", "none: every train device holds the whole AdamW state; optimizer: each of the W train devices "
                "owns the state of 1/W of the parameters (whole tensors), steps them and all-gathers them; full: "
                "each holds only its 1/W of the parameters too, gathers each module's for its forward and "
                "backward and sends each gradient to its owner (micro-batches in lockstep rounds). All three "
                "give the same bits and write the same checkpoint bytes")
    max_recoveries: int = help_field(3, "worker deaths a run survives (each: the dead actor replaced, the state "
                                        "restored from a surviving train device, the step run again); 0: stop "
                                        "at the first")

    def __post_init__(self) -> None:
        check(self.devices >= 2, "devices", self.devices,
              "a disaggregated job needs at least 2 devices (one rollout, one train); use pipeline.mode=colocated for 1")
        check(self.threads_per_device >= 1, "threads_per_device", self.threads_per_device, "must be >= 1")
        check(0 < self.gpus_per_device <= 1, "gpus_per_device", self.gpus_per_device,
              "must be in (0, 1]: 1 = a GPU per device, 0.5 = two devices per GPU")
        check(self.gpus_per_device == 1 or self.device == "cuda", "gpus_per_device", self.gpus_per_device,
              "shares GPUs, so it needs cluster.device=cuda; drop it on CPU")
        if self.split:
            check(len(self.split) == 2, "split", list(self.split), "give [rollout devices, train devices]")
            check(min(self.split) >= 1, "split", list(self.split),
                  "both roles need at least one device, e.g. [2, 2]")
            check(sum(self.split) == self.devices, "split", list(self.split),
                  f"must add up to cluster.devices ({self.devices})")
        check(self.connect_timeout_s > 0, "connect_timeout_s", self.connect_timeout_s, "must be > 0")
        check(self.reserve_devices >= 0, "reserve_devices", self.reserve_devices, "must be >= 0")
        check(self.step_timeout_s > 0, "step_timeout_s", self.step_timeout_s, "must be > 0 seconds, e.g. 600")
        check(self.max_recoveries >= 0, "max_recoveries", self.max_recoveries, "must be >= 0")


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
    devices_per_process: int = help_field(0, "emulated devices hosted by one Ray actor process (each keeps its own "
                                             "thread and call order); 0 = auto: one each up to 16 devices, then "
                                             "as many as keep 16 processes")

    def __post_init__(self) -> None:
        check(self.time_scale > 0, "time_scale", self.time_scale, "must be > 0, e.g. 0.1")
        check(self.devices_per_process >= 0, "devices_per_process", self.devices_per_process,
              "must be >= 0 (0 = auto, 1 = a process per device)")

    def per_process(self, devices: int) -> int:
        """Emulated devices per actor process for a job of `devices` (pool and reserve)."""
        return self.devices_per_process or max(1, -(-devices // AUTO_EMULATED_PROCESSES))


# A reward's magnitude bound: beyond it a reward is a failed call (poise.rewards.scorer). A finite
# 1e308 passes isfinite yet overflows the sums and squares the advantages take; within these bounds a
# weighted sum over functions and the std of a step's batch stay far from float overflow.
REWARD_LIMIT = 1e12
REWARD_WEIGHT_LIMIT = 1e6


@dataclass(frozen=True)
class RewardFunctionConfig:
    """One reward function of `reward.functions` (poise.rewards.functions resolves it at start)."""

    fn: str = help_field("task", "a built-in (task, exact, items, math, code), an import path 'module:function' "
                                 "or a file 'path/to/file.py:function'; TRL's signature "
                                 "fn(prompts, completions, **columns) -> list[float]")
    weight: float = help_field(1.0, "the run's reward is the weighted sum of its functions' rewards")
    name: str = help_field("", "metrics key reward/<name>; empty = the built-in's name or the function's")

    def __post_init__(self) -> None:
        check(bool(self.fn.strip()), "fn", self.fn, "name a function: a built-in (task, exact, items, math, code), "
                                                    "'module:function' or 'path/to/file.py:function'")
        if ":" in self.fn:
            where, _, attr = self.fn.rpartition(":")
            check(bool(where) and all(part.isidentifier() for part in attr.split(".")), "fn", self.fn,
                  "write 'module:function' or 'path/to/file.py:function'")
        else:
            check(self.fn in REWARD_BUILTINS, "fn", self.fn, f"unknown built-in; choose one of "
                  f"{', '.join(REWARD_BUILTINS)}, or give 'module:function' or 'path/to/file.py:function'")
        check(math.isfinite(self.weight) and abs(self.weight) <= REWARD_WEIGHT_LIMIT, "weight", self.weight,
              f"must be a finite number within ±{REWARD_WEIGHT_LIMIT:g}, e.g. 1.0")

    @property
    def label(self) -> str:
        """Its metrics name: `name`, else the built-in's name or the function's attribute."""
        return self.name or self.fn.rpartition(":")[2].rpartition(".")[2]


@dataclass(frozen=True)
class RewardConfig:
    """How samples are scored: which functions, and the sandbox they run in (poise.rewards)."""

    functions: tuple[RewardFunctionConfig | str, ...] = help_field(
        (), "[{fn: my_module:score, weight: 1.0}, ...] (or just [math, 'file.py:f']); empty = the built-in per-row "
            "task reward (`task`: each row's exact/items kind)")
    timeout_s: float = help_field(10.0, "wall-clock seconds one function may take on one sample; past it the "
                                        "sandbox worker is killed and replaced and the sample gets the fallback")
    fallback: float = help_field(0.0, "the reward of a function that timed out, crashed, raised or returned "
                                      "something other than one finite number (counted in reward_failures)")
    workers: int = help_field(2, "sandboxed reward worker processes, started once per run")
    memory_mb: int = help_field(2048, "address-space limit (RLIMIT_AS) of each reward worker, in MiB")
    cpu_s: float = help_field(10.0, "CPU seconds (RLIMIT_CPU) one function may use on one sample")
    isolation: str = help_field("batch", "what one fresh process of a reward worker runs: `batch` (up to 64 calls of "
                                         "one submitted batch; a reward cannot touch another batch's results) or "
                                         "`call` (one sample: nor another sample's; ~1 ms more a call)")

    def __post_init__(self) -> None:
        entries = []
        for i, f in enumerate(self.functions):
            try:
                entries.append(RewardFunctionConfig(fn=f) if isinstance(f, str) else f)
            except ConfigError as e:  # the shorthand `- math` is checked here, not by schema.build
                raise ConfigError(f"functions[{i}].{e.key}", e.value, e.allowed) from None
        object.__setattr__(self, "functions", tuple(entries))
        labels = [f.label for f in self.functions]
        for i, label in enumerate(labels):
            check(labels.index(label) == i, f"functions[{i}].name", label,
                  "two functions would both report as reward/" + label + "; give one a distinct `name`")
        check(self.timeout_s > 0, "timeout_s", self.timeout_s, "must be > 0, e.g. 10")
        check(math.isfinite(self.fallback) and abs(self.fallback) <= REWARD_LIMIT, "fallback", self.fallback,
              f"must be a finite number within ±{REWARD_LIMIT:g}, e.g. 0.0")
        check(self.workers >= 1, "workers", self.workers, "must be >= 1")
        check(self.memory_mb >= 64, "memory_mb", self.memory_mb, "must be >= 64 (a Python worker needs ~30 MiB)")
        check(self.cpu_s > 0, "cpu_s", self.cpu_s, "must be > 0, e.g. 10")
        check(self.isolation in ("batch", "call"), "isolation", self.isolation, "must be batch or call")

    @property
    def resolved(self) -> tuple[RewardFunctionConfig, ...]:
        """The functions that score a run: `functions`, or the built-in per-row `task` reward."""
        return self.functions or (RewardFunctionConfig(),)


ENV_BUILTINS = {"guess": "poise.episodes.guess:GuessEnv", "tools": "poise.episodes.tools:ToolEnvironment"}


@dataclass(frozen=True)
class EnvConfig:
    """Multi-turn episodes (poise.episodes, docs/episodes.md): an environment answers each model turn."""

    name: str | None = help_field(None, "the environment: a built-in (guess, tools) or module:Class / "
                                        "path/to/file.py:Class; null = single-turn (one answer per prompt)")
    args: dict[str, Any] | None = help_field(None, "keyword arguments of the environment's constructor, e.g. "
                                                      "{tools: [calculator]}; null = none")
    max_turns: int = help_field(4, "model turns per episode at most (the environment may end it sooner)")
    max_tokens: int = help_field(0, "tokens of an episode after its prompt at most, model and observation "
                                    "tokens together; 0 = the engine's context less the prompt")
    max_observation_chars: int = help_field(2000, "characters one observation may have; a longer one fails "
                                                  "that environment call (env_failures) and ends the episode")

    def __post_init__(self) -> None:
        check(self.name is None or (isinstance(self.name, str) and self.name.strip() != ""), "name", self.name,
              "give a built-in (guess, tools), module:Class or path/to/file.py:Class, or null")
        check(self.name is None or self.name in ENV_BUILTINS or ":" in self.name, "name", self.name,
              "give a built-in (guess, tools), module:Class or path/to/file.py:Class")
        check(self.args is None or isinstance(self.args, Mapping), "args", self.args,
              "must be a mapping of constructor keyword arguments")
        check(isinstance(self.max_turns, int) and self.max_turns >= 1, "max_turns", self.max_turns,
              "must be an integer >= 1, e.g. 4")
        check(self.max_tokens >= 0, "max_tokens", self.max_tokens, "must be >= 0 (0 = the context less the prompt)")
        check(self.max_observation_chars >= 1, "max_observation_chars", self.max_observation_chars,
              "must be >= 1, e.g. 2000")

    def response_tokens(self, max_new_tokens: int) -> int:
        """Tokens after the prompt that the engine's context must hold: one answer's, or an episode's
        (env.max_tokens, else as many as the model's positions allow: a large number the context is capped by)."""
        if self.name is None:
            return max_new_tokens
        return self.max_tokens or 1 << 20

    @property
    def path(self) -> str | None:
        """The environment's import path (a built-in's resolved)."""
        return ENV_BUILTINS.get(self.name, self.name) if self.name is not None else None


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation between steps (poise.evaluation): it never changes a training bit."""

    every: int = help_field(0, "evaluate on held-out problems after every N steps and after the last; 0 = off "
                               "(`poise eval` evaluates a checkpoint whatever this is)")
    dataset: str | None = help_field(None, "held-out dataset: a .jsonl or .parquet file or a `datasets` "
                                           "save_to_disk directory with data.prompt_key and data.answer_key columns; "
                                           "null = held-out problems of the built-in tasks (a pool disjoint from "
                                           "training's); needed when data.dataset is set")
    problems: int = help_field(64, "held-out problems per evaluation: the dataset's first N rows (0 = all rows) or "
                                   "N problems of the built-in tasks")
    greedy: bool = help_field(True, "one greedy (temperature 0) response per problem: eval/greedy/...")
    k: int = help_field(0, "sampled responses per problem at algorithm.sampling's temperature: eval/sampled/... "
                           "and eval/pass@k (a problem passes if one of its k responses does); 0 = none")
    pass_threshold: float = help_field(1.0, "a response passes when its reward is >= this (eval/.../pass_rate, "
                                         "eval/pass@k)")

    def __post_init__(self) -> None:
        check(self.every >= 0, "every", self.every, "must be >= 0 (0 = off), e.g. 10")
        check(self.problems >= 0, "problems", self.problems, "must be >= 0 (0 = every row of eval.dataset)")
        check(self.k >= 0, "k", self.k, "must be >= 0 (0 = greedy only), e.g. 4")
        check(self.greedy or self.k >= 1, "k", self.k, "with greedy=false there is nothing to evaluate; set k >= 1 "
                                                      "or greedy=true")
        check(math.isfinite(self.pass_threshold), "pass_threshold", self.pass_threshold, "must be a finite number, e.g. 1.0")
        check(self.dataset is None or bool(self.dataset.strip()), "dataset", self.dataset,
              "name a held-out file or directory, or null for the built-in tasks")


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
    reward: RewardConfig = help_factory(RewardConfig, "reward functions and the sandbox they run in")
    resize: ResizeConfig = help_factory(ResizeConfig, "live resizing: static split, a forced schedule, or the "
                                        "resize controller")
    controller: ControllerConfig = help_factory(ControllerConfig, "resize controller hysteresis "
                                                "(resize.policy: controller)")
    scale: ScaleConfig = help_factory(ScaleConfig, "elastic scale-out: reserve devices (cluster.reserve_devices) "
                                      "join as rollout instances, by a schedule or the scale controller")
    determinism: Literal["bitwise", "semantic"] = help_field(
        "bitwise", "bitwise: results identical bit for bit across splits and restarts; semantic: faster")
    eval: EvalConfig = help_factory(EvalConfig, "held-out evaluation every N steps and at the end (off by default)")
    env: EnvConfig = help_factory(EnvConfig, "multi-turn episodes: the environment that answers each model turn "
                                  "(off by default)")

    def __post_init__(self) -> None:
        self._check_backend()
        if self.determinism == "bitwise" and not self.rollout.batch_invariant:
            # bitwise trajectories need batch-invariant decoding (docs/design.md invariant 1)
            object.__setattr__(self, "rollout", dataclasses.replace(self.rollout, batch_invariant=True))
        # only a simulated or emulated workload knows its output lengths before generating them
        check(self.dispatch.ranker != "oracle" or self.cluster.compute == "emulated", "dispatch.ranker", "oracle",
              "needs the true output lengths, which only the simulator and cluster.compute=emulated have; "
              "use history or learned")
        self._check_resize()
        self._check_scale()
        a = self.algorithm
        check(not self.pipeline.assist or a.old_logprobs == "rollout" or a.updates_per_step == 1, "pipeline.assist",
              True, "with algorithm.old_logprobs=recompute and updates_per_step > 1 is not built (a helping rollout "
              "device keeps no step-start weights); set updates_per_step=1 or pipeline.assist=false")
        check(not self.pipeline.assist or self.cluster.shard == "none", "pipeline.assist", True,
              f"is not built with cluster.shard={self.cluster.shard} (a helping rollout device owns no optimizer "
              "state); drop one of them")
        self._check_lora()
        self._check_full_shard()
        check(not self.pipeline.assist or self.pipeline.mode == "sync", "pipeline.assist", True,
              f"needs pipeline.mode=sync (with {self.pipeline.mode}, no rollout device is idle while the trainer "
              "works); set it false")
        check(not self.algorithm.dynamic_sampling or self.cluster.compute == "real", "algorithm.dynamic_sampling",
              True, "needs real rewards to drop groups by; cluster.compute=emulated has none: set it false")
        self._check_eval()
        self._check_env()
        s = self.algorithm.sampling
        if self.model.path is None:
            need = self.model.tiny.max_positions
            check(s.max_new_tokens < need, "algorithm.sampling.max_new_tokens", s.max_new_tokens,
                  f"must leave room for the prompt within model.tiny.max_positions ({need})")


    def _check_env(self) -> None:
        """What episodes (env.name) do not run with yet: each refused in one line, before any work."""
        if self.env.name is None:
            return
        for on, key, value, why in (
                (self.algorithm.dynamic_sampling, "algorithm.dynamic_sampling", True, "set it false"),
                (self.cluster.compute == "emulated", "cluster.compute", "emulated", "use cluster.compute=real"),
                (self.eval.every > 0, "eval.every", self.eval.every, "set eval.every=0 (held-out evaluation "
                 "generates single answers)"),
                (self.pipeline.assist, "pipeline.assist", True, "set it false")):
            check(not on, key, value, f"is not built with multi-turn episodes (env.name={self.env.name}) yet; {why}")

    def _check_full_shard(self) -> None:
        """What `cluster.shard: full` does not shard yet: the models beside the policy."""
        if self.cluster.shard != "full":
            return
        a = self.algorithm
        check(a.kl_coef == 0, "cluster.shard", "full", f"with algorithm.kl_coef={a.kl_coef} is not built (the "
              "reference model would be a whole copy on every train device); use cluster.shard=optimizer")
        check(a.old_logprobs == "rollout" or a.updates_per_step == 1, "cluster.shard", "full",
              "with algorithm.old_logprobs=recompute and updates_per_step > 1 is not built (the step-start "
              "weights would be a whole copy); set updates_per_step=1 or cluster.shard=optimizer")
        check(self.pipeline.mode != "colocated", "cluster.shard", "full", "with pipeline.mode=colocated has one "
              "device and nothing to shard over; set cluster.shard=none")

    def _check_backend(self) -> None:
        """What the vLLM backend needs (rollout/vllm_engine.py), every unmet need in one line; a
        missing vLLM alone is check_vllm's (before Ray), which also checks the model."""
        if self.rollout.backend != "vllm":
            return
        needs = [need for unmet, need in (
            (self.determinism != "semantic", "determinism=semantic (vLLM is not batch-invariant: its batch-invariant "
                                             "kernels are Triton, GPU only)"),
            (self.cluster.compute != "real", "cluster.compute=real (emulated devices hold no model)"),
            (self.model.lora is not None, "no model.lora (vLLM does not take Poise's LoRA adapters yet)"),
            (bool(self.rollout.stop_strings), "no rollout.stop_strings (they are not passed to vLLM; end responses "
                                              "with EOS)")) if unmet]
        if needs and not _installed("vllm"):
            needs.append("vLLM installed (make vllm; train from .venv-vllm/bin/poise)")
        check(not needs, "rollout.backend", "vllm",
              f"needs {'; '.join(needs)}; or set rollout.backend=poise for bit-exact runs")

    def _check_lora(self) -> None:
        """What model.lora needs, every unmet need in one line; a missing peft alone is
        check_before_work's."""
        lora = self.model.lora
        if lora is None:
            return
        needs = [need for unmet, need in (
            (lora.dropout != 0 and self.determinism == "bitwise",
             f"model.lora.dropout 0 (got {lora.dropout}: it draws from torch's global generator, not from the "
             "sample id: bitwise needs 0, or set determinism: semantic)"),
            (self.cluster.shard == "full", "cluster.shard=optimizer or none (cluster.shard=full with model.lora is "
                                           "not built; the adapter is small)")) if unmet]
        if needs and not _installed("peft"):
            needs.append("the peft package (pip install 'poise[lora]')")
        check(not needs, "model.lora", f"r={lora.r}", f"needs {'; '.join(needs)}")

    def _check_resize(self) -> None:
        """A schedule or a controller needs a disaggregated pipeline and splits of this job."""
        r = self.resize
        if not r.schedule and r.policy == "static":
            return
        what = "resize.schedule" if r.schedule else "resize.policy"
        check(self.pipeline.mode != "colocated", what, list(r.schedule) or r.policy,
              "pipeline.mode=colocated has one device and nothing to resize; use sync or async, or drop it")
        devices = self.cluster.devices
        for at, split in r.scheduled().items():
            check(split.rollout + split.train == devices, f"resize.schedule (at_step {at}).split", split.as_list(),
                  f"must add up to cluster.devices={devices}")
            check(at < self.run.steps, f"resize.schedule (at_step {at}).at_step", at,
                  f"is beyond run.steps={self.run.steps} (steps 0..{self.run.steps - 1}); schedule an earlier step")
        for i, split in enumerate(parse_splits(r.allowed_splits, "resize.allowed_splits")):
            check(split.rollout + split.train == devices, f"resize.allowed_splits[{i}]", split.as_list(),
                  f"must add up to cluster.devices={devices}")


    def _check_eval(self) -> None:
        """Held-out problems exist for this run: a dataset run needs its own held-out rows."""
        e = self.eval
        if not e.every:
            return
        check(self.data.dataset is None or e.dataset is not None, "eval.dataset", None,
              "data.dataset is set, so the built-in tasks are not this run's task; name a held-out file with the "
              "same columns (eval.dataset=path) or set eval.every=0")
        check(e.dataset is not None or e.problems >= 1, "eval.problems", e.problems,
              "must be >= 1 for the built-in tasks (0 means every row of an eval.dataset)")
        check(self.cluster.compute == "real", "eval.every", e.every,
              "needs cluster.compute=real (emulated devices hold no model to evaluate); set eval.every=0")

    def _check_scale(self) -> None:
        """Joins need reserve devices, a disaggregated pipeline and a fixed split (runtime/scale.py)."""
        sc = self.scale
        if not sc.active:
            return
        what = "scale.schedule" if sc.schedule else "scale.policy"
        check(self.pipeline.mode != "colocated", what, list(sc.schedule) or sc.policy,
              "pipeline.mode=colocated has no rollout instances to add; use sync or async, or drop it")
        reserve = self.cluster.reserve_devices
        check(reserve >= 1, "cluster.reserve_devices", reserve, f"{what} needs reserve devices to join; set it >= 1")
        check(sc.most_added(reserve) <= reserve, "scale.schedule", list(sc.schedule),
              f"adds more devices than cluster.reserve_devices={reserve}; add reserve devices or join fewer")
        for after in sc.scheduled():
            check(after < self.run.steps - 1, "scale.schedule.after_step", after,
                  f"a join after step {after} serves no step of run.steps={self.run.steps}; schedule an earlier step")
        check(not self.resize.schedule and self.resize.policy == "static", what, list(sc.schedule) or sc.policy,
              "scale-out and resizing (resize.schedule or resize.policy=controller) exclude each other for now; "
              "drop one")


# Names TRL's GRPOConfig and verl's trainer config use, and where the same setting lives here: an
# unknown key with one of these names gets this hint instead of a spelling suggestion.
FOREIGN_KEYS = {
    "beta": "TRL's beta is algorithm.kl_coef",
    "kl_loss_coef": "verl's kl_loss_coef is algorithm.kl_coef",
    "kl_loss_type": "verl's kl_loss_type is algorithm.kl_estimator (kl = k1, mse = k2, low_var_kl = k3)",
    "num_generations": "TRL's num_generations is algorithm.group_size",
    "learning_rate": "TRL's learning_rate is algorithm.lr",
    "epsilon": "TRL's epsilon is algorithm.clip_eps (or clip_eps_low)",
    "epsilon_high": "TRL's epsilon_high is algorithm.clip_eps_high",
    "clip_ratio": "verl's clip_ratio is algorithm.clip_eps",
    "clip_ratio_low": "verl's clip_ratio_low is algorithm.clip_eps_low",
    "clip_ratio_high": "verl's clip_ratio_high is algorithm.clip_eps_high",
    "loss_type": "TRL's loss_type is algorithm.loss_agg: its grpo (a mean per response) is loss_agg=sequence, not "
                 "algorithm.loss=grpo (a mean over every token of the step: TRL's dapo with epsilon_high = epsilon); "
                 "its dapo is loss_agg=token, its dr_grpo loss_agg=constant; its bnpo has no equivalent (use "
                 "loss_agg=token)",
    "loss_agg_mode": "verl's loss_agg_mode is algorithm.loss_agg (token-mean = token, seq-mean-token-mean = "
                     "sequence, seq-mean-token-sum = sequence_sum, seq-mean-token-sum-norm = constant)",
    "adv_estimator": "verl's adv_estimator is algorithm.advantage (grpo, dr_grpo, rloo, reinforce_pp)",
    "entropy_coeff": "verl's entropy_coeff is algorithm.entropy_coef",
    "importance_sampling_level": "TRL's importance_sampling_level is algorithm.ratio_level (token, sequence)",
    "max_completion_length": "TRL's max_completion_length is algorithm.sampling.max_new_tokens",
    "response_length": "verl's response_length is algorithm.sampling.max_new_tokens",
    "temperature": "temperature is algorithm.sampling.temperature",
    "top_p": "top_p is algorithm.sampling.top_p",
    "top_k": "top_k is algorithm.sampling.top_k",
    "per_device_train_batch_size": "TRL's per_device_train_batch_size is algorithm.micro_batch_size (samples)",
    "ppo_micro_batch_size_per_gpu": "verl's ppo_micro_batch_size_per_gpu is algorithm.micro_batch_size",
    "train_batch_size": "verl's train_batch_size is algorithm.prompts_per_step",
    "max_steps": "TRL's max_steps is run.steps",
    "total_training_steps": "verl's total_training_steps is run.steps",
    "output_dir": "TRL's output_dir is run.dir",
    "save_steps": "TRL's save_steps is run.checkpoint_every",
    "save_total_limit": "TRL's save_total_limit is run.keep_checkpoints",
    "eval_steps": "TRL's eval_steps is eval.every (held-out evaluation every N steps)",
    "eval_strategy": "TRL's eval_strategy is eval.every (0 = no evaluation)",
    "eval_dataset": "the held-out dataset is eval.dataset",
    "test_freq": "verl's test_freq is eval.every",
    "model_name_or_path": "model_name_or_path is model.path (a local HF directory)",
    "report_to": "report_to is run.tensorboard",
    "lora": "LoRA is model.lora: {r, alpha, dropout, target_modules}",
    "lora_r": "TRL's lora_r is model.lora.r",
    "lora_alpha": "TRL's lora_alpha is model.lora.alpha",
    "lora_dropout": "TRL's lora_dropout is model.lora.dropout",
    "lora_target_modules": "TRL's lora_target_modules is model.lora.target_modules",
    "use_peft": "LoRA is model.lora: {r, alpha, dropout, target_modules}",
}


# TRL's bnpo divides each micro-batch by its own token count: its update depends on how the batch
# is cut into micro-batches, which Poise keeps free (any split, any number of train devices).
BNPO_REFUSAL = ("TRL's bnpo divides each micro-batch by its own token count, so its update depends on how the "
                "batch is cut into micro-batches; use algorithm.loss_agg=token (the step's token count, TRL's dapo)")


def load_train_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """The config of YAML file `path` (None: the defaults) with dotted `overrides` applied."""
    data = read_yaml(path) if path is not None else {}
    apply_overrides(data, list(overrides or []))
    return build_train_config(data)


def build_train_config(data: Mapping[str, Any]) -> TrainConfig:
    """The config of a mapping as a YAML file holds it; a TRL or verl key name gets its Poise name."""
    try:
        return build(TrainConfig, data)
    except ConfigError as e:
        if e.key in ("algorithm.loss", "algorithm.loss_agg") and e.value == "bnpo":
            raise ConfigError(e.key, e.value, BNPO_REFUSAL) from None
        foreign = FOREIGN_KEYS.get(e.key.rpartition(".")[2])
        if foreign is None or not e.allowed.startswith("unknown key"):
            raise
        raise ConfigError(e.key, e.value, f"unknown key; {foreign}") from None


__all__ = ["TrainConfig", "RunConfig", "WandbConfig", "ModelConfig", "TinyModelConfig", "DataConfig",
           "AlgorithmConfig", "SamplingConfig", "EngineConfig", "PipelineConfig", "ClusterConfig", "EmulationConfig",
           "DispatchConfig", "SFTConfig", "EvalConfig", "LoraConfig", "RewardConfig", "RewardFunctionConfig", "LOSS_PRESETS", "load_train_config",
           "build_train_config", "ConfigError"]
