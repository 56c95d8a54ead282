"""The rollout backend a config names (`rollout.backend`): Poise's engine or vLLM's, both
`RolloutEngine`s over the same module tree (runtime/roles.py)."""

from __future__ import annotations

import time
from typing import Callable

import torch

from poise.config import EngineConfig, SamplingConfig


def build_engine(model: torch.nn.Module, cfg: EngineConfig, sampling: SamplingConfig, seed: int,
                 eos_id: int | None, *, clock: Callable[[], float] = time.perf_counter, tokenizer=None):
    """The engine of `cfg.backend` on `model`'s weights: `poise.rollout.engine.Engine` (poise) or
    `poise.rollout.vllm_engine.VllmEngine` (vllm; imports vLLM only when it starts)."""
    if cfg.backend == "vllm":
        from poise.rollout.vllm_engine import VllmEngine

        return VllmEngine(model, cfg, sampling, seed, eos_id, clock=clock)
    from poise.rollout.engine import Engine

    return Engine(model, cfg, sampling, seed, eos_id, tokenizer=tokenizer, clock=clock)
