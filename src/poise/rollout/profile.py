"""Measure the rollout engine's cost model: decode step vs batch and context, prefill vs prompt.

Writes the `poise-profile/1` JSON of docs/profile-format.md, which `poise.policy.cost` reads.
Every figure times what one engine step really runs: the runner's forward over the slot cache
(`DecoderRunner.forward`, the engine's own kernels and attention layout) plus `sample_next`, the
median of `repeats` timed runs after a warm-up. Cache contents are whatever they are: the
forward's cost does not depend on the values.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from poise.errors import ConfigError
from poise.rollout.kv_cache import KVCache
from poise.rollout.runner import DecoderRunner, StepInputs
from poise.rollout.sampling import SamplingConfig, sample_next
from poise.schema import check, help_field

FORMAT = "poise-profile/1"


@dataclass(frozen=True)
class ProfileConfig:
    batch_sizes: tuple[int, ...] = help_field((1, 2, 4, 8, 16, 32), "decode batch sizes (live slots)")
    contexts: tuple[int, ...] = help_field((32, 64, 128, 224), "decode context lengths in tokens")
    prompt_lengths: tuple[int, ...] = help_field((8, 16, 32, 64, 128), "prefill prompt lengths in tokens")
    repeats: int = help_field(5, "timed runs per point (the median is kept), after one warm-up")

    def __post_init__(self) -> None:
        for key in ("batch_sizes", "contexts", "prompt_lengths"):
            values = getattr(self, key)
            check(bool(values) and all(v >= 1 for v in values), key, values, "must be a non-empty list of ints >= 1")
        check(self.repeats >= 1, "repeats", self.repeats, "must be >= 1")


def _median_seconds(fn: Callable[[], Any], repeats: int, sync: Callable[[], None]) -> float:
    fn()  # warm-up: allocator, kernel selection
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profile_model(model: torch.nn.Module, cfg: ProfileConfig, name: str,
                  sampling: SamplingConfig | None = None,
                  progress: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    """The profile JSON (as a dict) of `model` on its current device and dtype."""
    sampling = sampling or SamplingConfig(temperature=1.0)
    runner = DecoderRunner(model.eval())
    longest = max(max(cfg.contexts), max(cfg.prompt_lengths))
    if longest > runner.max_positions:
        raise ConfigError("contexts", longest, f"must not exceed the model's max_position_embeddings "
                                               f"({runner.max_positions})")
    slots = max(cfg.batch_sizes)
    cache = KVCache(runner.cache_shape(slots, longest), runner.dtype, runner.device)
    device = runner.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    total = len(cfg.batch_sizes) * len(cfg.contexts) + len(cfg.prompt_lengths)
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, what)

    def step_and_sample(step: StepInputs, rows: int) -> None:
        logits = runner.forward(step, cache)
        ids = torch.zeros((rows, 3), dtype=torch.int64, device=device)
        ids[:, 1] = torch.arange(rows, device=device)
        tokens, _ = sample_next(logits, 0, ids, torch.zeros(rows, dtype=torch.int64, device=device), sampling)
        tokens.tolist()  # the engine reads every step's tokens back to the host

    decode = []
    for context in cfg.contexts:
        for batch in cfg.batch_sizes:
            step = StepInputs(decode_slots=list(range(batch)), decode_tokens=[3] * batch,
                              decode_positions=[context - 1] * batch)
            seconds = _median_seconds(lambda: step_and_sample(step, batch), cfg.repeats, sync)
            decode.append({"batch": batch, "context": context, "seconds_per_step": seconds})
            tick(f"decode batch {batch} context {context}")
    prefill = []
    for tokens in cfg.prompt_lengths:
        step = StepInputs(prefills=[(0, [3] * tokens)])
        seconds = _median_seconds(lambda: step_and_sample(step, 1), cfg.repeats, sync)
        prefill.append({"tokens": tokens, "seconds": seconds})
        tick(f"prefill {tokens} tokens")

    # throughput at the largest batch, context averaged over the grid
    top = [row for row in decode if row["batch"] == slots]
    per_step = statistics.mean(row["seconds_per_step"] for row in top)
    config = model.config
    return {
        "format": FORMAT,
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "model": {"name": name, "params": sum(p.numel() for p in model.parameters()),
                  "layers": config.num_hidden_layers, "hidden": config.hidden_size,
                  "dtype": str(runner.dtype).removeprefix("torch.")},
        "decode": decode,
        "prefill": prefill,
        "tokens_per_second": slots / per_step,
        "measured": {"threads": torch.get_num_threads(), "repeats": cfg.repeats, "statistic": "median",
                     "torch": torch.__version__, "sampling_temperature": sampling.temperature},
    }
