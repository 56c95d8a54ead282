"""One row of RUN_DIR/metrics.jsonl per RL step, the same for the colocated loop and the Ray driver.

Torch-free: the row is built from the step's samples, rewards and the trainer's stats.
"""

from __future__ import annotations

from typing import Iterable, Sequence

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


def token_versions(sample: Sample) -> tuple[int, ...]:
    """The weights version that sampled each token of `sample` (types.Sample.token_versions; None
    spells weights_version for every token)."""
    if sample.token_versions is None:
        return (sample.weights_version,) * len(sample.token_ids)
    return sample.token_versions


def staleness_histogram(token_versions_per_sample: Iterable[tuple[int, ...]], trained_version: int) -> dict[str, float]:
    """`partial/staleness_<lag>`: how many tokens of a step were sampled `lag` = trained_version -
    their version updates before the weights the step trains (0: on-policy), one key per lag that
    occurs, in lag order. `token_versions_per_sample`: each sample's per-token versions
    (`token_versions`). A token newer than `trained_version` is a bug upstream: ValueError."""
    counts: dict[int, int] = {}
    for versions in token_versions_per_sample:
        for version in versions:
            lag = trained_version - version
            if lag < 0:
                raise ValueError(f"a token of weights version {version} is newer than the trained version "
                                 f"{trained_version}")
            counts[lag] = counts.get(lag, 0) + 1
    return {f"partial/staleness_{lag}": float(counts[lag]) for lag in sorted(counts)}
