"""What every training mode needs before its first step: threads, tokenizer, model, prompts."""

from __future__ import annotations

from pathlib import Path

import torch

from poise.config import DataConfig, ModelConfig, TrainConfig
from poise.data.tasks import DatasetSource, Problem, TaskSource
from poise.data.tokenizer import SEPARATOR, Tokenizer, load_tokenizer
from poise.model.loading import build_tiny, load_model


def pin_threads(threads: int, bitwise: bool) -> None:
    """Fixed torch threads per device: bitwise mode needs the same reduction order every run."""
    torch.set_num_threads(threads)
    if bitwise:
        torch.use_deterministic_algorithms(True, warn_only=True)


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


def make_model(cfg: TrainConfig, tokenizer: Tokenizer, progress: bool = True) -> torch.nn.Module:
    """The initial policy: a local checkpoint, made first by SFT if asked, or the tiny model."""
    m = cfg.model
    if m.path is None:
        return build_tiny(m.tiny, tokenizer.vocab_size, cfg.run.seed, tokenizer.eos_id, tokenizer.pad_id,
                          tokenizer.bos_id)
    if m.sft_if_missing and not Path(m.path, "config.json").is_file():
        from poise.train.sft import run_sft

        run_sft(m, cfg.data, Path(m.path), threads=cfg.cluster.threads_per_device, progress=progress)
    return load_model(m.path)
