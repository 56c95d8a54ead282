"""The `data:` section: the task mix or a dataset, and the tokenizer.

The task families and the phases of a mix are plain data here, so the section checks them
without the tasks themselves (poise.data.tasks makes the problems)."""

from __future__ import annotations

from dataclasses import dataclass

from poise.errors import ConfigError
from poise.schema import check, help_field

FAMILIES = ("arith", "span", "sort", "count", "guess")


@dataclass(frozen=True)
class Phase:
    """A stretch of training with a fixed task mix. `until_step` is exclusive; None = to the end."""

    mix: dict[str, float]
    until_step: int | None = None


def validate_phases(phases: tuple[Phase, ...], key: str = "data.phases") -> None:
    if not phases:
        raise ConfigError(key, [], "give at least one phase, e.g. [{mix: {arith: 1.0}}]")
    last = 0
    for i, phase in enumerate(phases):
        for name, weight in phase.mix.items():
            if name not in FAMILIES:
                raise ConfigError(f"{key}[{i}].mix", name, f"unknown task family; choose from {', '.join(FAMILIES)}")
            if not weight >= 0:
                raise ConfigError(f"{key}[{i}].mix.{name}", weight, "weights must be >= 0")
        if sum(phase.mix.values()) <= 0:
            raise ConfigError(f"{key}[{i}].mix", dict(phase.mix), "weights must sum to more than 0")
        is_last = i == len(phases) - 1
        if phase.until_step is None and not is_last:
            raise ConfigError(f"{key}[{i}].until_step", None, "only the last phase may omit until_step")
        if phase.until_step is not None:
            if phase.until_step <= last:
                raise ConfigError(f"{key}[{i}].until_step", phase.until_step,
                                  f"must be greater than the previous phase's end ({last})")
            last = phase.until_step


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
