"""Held-out responses on a model, with engines of their own (torch).

A training engine's slots, queue, noise table and weights version are left as they were: each mode
(greedy, sampled) gets a fresh `Engine` over the same modules, which frees its KV cache when done.
Sampling randomness is a function of (seed, sample id, position) and eval ids are their own
(heldout.eval_sample_id), so the responses do not depend on which device or batch ran them.
"""

from __future__ import annotations

import dataclasses

import torch

from poise.config import EngineConfig, SamplingConfig
from poise.rollout.engine import Engine
from poise.types import Request, Sample


def generate_heldout(model: torch.nn.Module, rollout: EngineConfig, sampling: SamplingConfig, seed: int,
                     eos_id: int | None, version: int, greedy: list[Request], sampled: list[Request],
                     tokenizer=None) -> list[Sample]:
    """Every request's response under the weights `model` holds now (stamped `version`): `greedy`
    at temperature 0, `sampled` with `sampling`; sorted by sample id."""
    out: list[Sample] = []
    for requests, mode in ((greedy, dataclasses.replace(sampling, temperature=0.0)), (sampled, sampling)):
        if not requests:
            continue
        engine = Engine(model, rollout, mode, seed, eos_id, tokenizer=tokenizer, weights_version=version)
        out += engine.generate(requests)
        engine.release()  # its KV cache and noise table: not held between evaluations
    return sorted(out, key=lambda s: s.sample_id)


def evaluate_model(heldout, model: torch.nn.Module, model_cfg, rollout: EngineConfig, sampling: SamplingConfig,
                   seed: int, eos_id: int | None, version: int) -> dict:
    """`{"eval": {...}}` of weights `version`, which `model` holds, on this process's device: the
    colocated loop between steps and `poise eval`. `heldout`: a heldout.HeldOut."""
    import time

    t = time.perf_counter()
    greedy, sampled = heldout.requests(version)
    rollout = dataclasses.replace(rollout, max_context=heldout.context(model_cfg, rollout.max_context, sampling))
    samples = generate_heldout(model, rollout, sampling, seed, eos_id, version, greedy, sampled)
    return heldout.metrics(samples, t)
