"""The `run:` section: the seed, the steps, the run directory, checkpoints and logging."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from poise.schema import check, help_field


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
