"""Measure the trainer's cost: one device's forward+backward over N tokens plus its optimizer step.

Adds the `train` table of docs/profile-format.md to a `poise profile` JSON. Every figure times
the trainer's own code (`PolicyTrainer.micro_batch_grad` per micro-batch, then `apply_update`),
the median of `repeats` timed runs after a warm-up, so the resize controller's cost model prices
1, 2 or 3 train devices with this machine's forward/backward and optimizer, not GPU defaults.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from poise.config import AlgorithmConfig
from poise.schema import check, help_field


@dataclass(frozen=True)
class TrainProfileConfig:
    micro_batches: tuple[int, ...] = help_field((1, 2, 4, 8), "micro-batches per timed update (the "
                                                "table's token counts are these x micro_batch_size x seq_len)")
    micro_batch_size: int = help_field(16, "samples per micro-batch")
    seq_len: int = help_field(64, "tokens per sample (prompt + response)")
    prompt_len: int = help_field(16, "prompt tokens per sample (no loss on them)")
    repeats: int = help_field(3, "timed runs per point (the median is kept), after one warm-up")

    def __post_init__(self) -> None:
        check(bool(self.micro_batches) and min(self.micro_batches) >= 1, "train micro_batches",
              self.micro_batches, "must be a non-empty list of ints >= 1")
        check(self.micro_batch_size >= 1, "train micro_batch_size", self.micro_batch_size, "must be >= 1")
        check(0 < self.prompt_len < self.seq_len, "train prompt_len", self.prompt_len,
              f"must be between 1 and seq_len - 1 ({self.seq_len - 1})")
        check(self.repeats >= 1, "train repeats", self.repeats, "must be >= 1")


@dataclass(frozen=True)
class _Sample:  # the fields PolicyTrainer reads (train.trainer.SampleLike)
    sample_id: tuple[int, int, int]
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]


def profile_train(model: torch.nn.Module, cfg: TrainProfileConfig, vocab_size: int,
                  progress: Callable[[str], None] | None = None) -> list[dict]:
    """Rows {tokens, seconds, micro_batches}: one update of `micro_batches` micro-batches on one
    device (forward+backward of each, then clip and the AdamW step). Trains a copy of `model`."""
    from copy import deepcopy

    from poise.training.trainer import PolicyTrainer

    model = deepcopy(model).train()
    trainer = PolicyTrainer(model, AlgorithmConfig(), pad_id=0)
    gen = torch.Generator().manual_seed(0)
    response = cfg.seq_len - cfg.prompt_len

    def micro(index: int) -> list[_Sample]:
        ids = torch.randint(1, vocab_size, (cfg.micro_batch_size, cfg.seq_len), generator=gen).tolist()
        return [_Sample((0, index, b), row[:cfg.prompt_len], row[cfg.prompt_len:], [-1.0] * response)
                for b, row in enumerate(ids)]

    rows = []
    for n in cfg.micro_batches:
        batches = [micro(i) for i in range(n)]
        advantages = torch.linspace(-1.0, 1.0, cfg.micro_batch_size)

        def update() -> None:
            grads = None
            for i, batch in enumerate(batches):
                g = trainer.micro_batch_grad(i, batch, advantages).grads
                grads = g if grads is None else [a + b for a, b in zip(grads, g)]
            trainer.apply_update(grads, float(n * cfg.micro_batch_size * response))

        update()  # warm-up
        times = []
        for _ in range(cfg.repeats):
            start = time.perf_counter()
            update()
            times.append(time.perf_counter() - start)
        rows.append({"tokens": n * cfg.micro_batch_size * cfg.seq_len, "seconds": statistics.median(times),
                     "micro_batches": n})
        if progress is not None:
            progress(f"train {n} micro-batches")
    return rows
