"""One row of RUN_DIR/metrics.jsonl per RL step, the same for the colocated loop and the Ray driver.

Torch-free: the row is built from the step's samples, rewards and the trainer's stats.
"""

from __future__ import annotations

from typing import Sequence

from poise.data.tasks import Problem
from poise.policy.cost import percentile
from poise.types import Sample, SampleId


def step_metrics(step: int, samples: Sequence[Sample], rewards: dict[SampleId, float], problems: list[Problem],
                 stats: dict, phases: dict[str, float]) -> dict:
    lengths = [len(s.token_ids) for s in samples]
    step_s = sum(phases.values())
    by_family: dict[str, list[float]] = {}
    for s in samples:
        by_family.setdefault(problems[s.sample_id[1]].family, []).append(rewards[s.sample_id])
    return {
        "step": step,
        "reward_mean": sum(rewards.values()) / len(rewards),
        "reward_by_family": {f: sum(v) / len(v) for f, v in sorted(by_family.items())},
        "response_len_mean": sum(lengths) / len(lengths),
        "response_len_p50": percentile(lengths, 0.5),
        "response_len_p99": percentile(lengths, 0.99),
        "response_len_max": max(lengths),
        "tokens": sum(lengths),
        "step_s": step_s,
        "phases": phases,
        "tokens_per_s": sum(lengths) / step_s if step_s > 0 else 0.0,
        "weights_version": samples[0].weights_version,
        **stats,
    }
