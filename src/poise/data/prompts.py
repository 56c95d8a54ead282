"""A run's prompts: where they come from, the tokenizer, and the token ids of prompt and answer.

Shared by the colocated loop, the Ray driver and SFT. Torch-free, so the driver of an emulated
job and the tokenizer-only callers never load torch.
"""

from __future__ import annotations

from poise.config import DataConfig, ModelConfig
from poise.data.tasks import DatasetSource, Problem, TaskSource, reward
from poise.data.tokenizer import SEPARATOR, Tokenizer, load_tokenizer


def make_tokenizer(data: DataConfig, model: ModelConfig) -> Tokenizer:
    return load_tokenizer(data.tokenizer, model.path)


def make_prompt_source(data: DataConfig, seed: int) -> TaskSource | DatasetSource:
    if data.dataset is not None:
        from poise.data.dataset import load_dataset

        return DatasetSource(seed, load_dataset(data.dataset))
    return TaskSource(seed, data.phases or None, data.pool_size)


def encode_prompt(tokenizer: Tokenizer, problem: Problem) -> list[int]:
    return [tokenizer.bos_id] + tokenizer.encode(problem.prompt) + tokenizer.encode(SEPARATOR)


def encode_answer(tokenizer: Tokenizer, problem: Problem) -> list[int]:
    return tokenizer.encode(problem.answer) + [tokenizer.eos_id]


class TaskSteps:
    """The step source of a real job: each step's prompts from the tasks or the dataset, their
    token ids, and each sample's exact reward (the emulated job's is runtime.emulated.Emulation)."""

    def __init__(self, data: DataConfig, model: ModelConfig, seed: int, prompts_per_step: int):
        self.tokenizer = make_tokenizer(data, model)
        self.source = make_prompt_source(data, seed)
        self.prompts_per_step = prompts_per_step

    def problems(self, step: int) -> list[Problem]:
        return self.source.prompts_for_step(step, self.prompts_per_step)

    def prompt_ids(self, problem: Problem) -> list[int]:
        return encode_prompt(self.tokenizer, problem)

    def score(self, problem: Problem, sample) -> float:
        eos = self.tokenizer.eos_id
        return reward(problem, self.tokenizer.decode([t for t in sample.token_ids if t != eos]))
