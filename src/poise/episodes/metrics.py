"""A step's episode metrics and rewards: turns, model vs observation tokens, environment time and
failures, tool calls, and why episodes ended; the environment's reward joins the reward functions'."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

from poise.episodes.episode import ENDS
from poise.episodes.runner import EpisodeStats
from poise.rewards.scorer import RewardFailure, RewardResult
from poise.types import Sample, SampleId, trained_tokens


def with_env_rewards(scored: Mapping[SampleId, RewardResult], stats: Mapping[SampleId, EpisodeStats]
                     ) -> dict[SampleId, RewardResult]:
    """Each episode's reward: the reward functions' (on its last turn) plus its environment's total,
    reported as reward/env; a failed environment call is a failure of `env`."""
    out = {}
    for sid, result in scored.items():
        s = stats[sid]
        failures = result.failures + ((RewardFailure("env", s.failure),) if s.failure else ())
        out[sid] = dataclasses.replace(result, value=result.value + s.env_reward,
                                       parts={**result.parts, "env": s.env_reward}, failures=failures)
    return out


def episode_metrics(stats: Iterable[EpisodeStats], counters: Mapping[str, object] | None = None) -> dict:
    """A step's episode metrics from its episodes' stats and the runner's step counters
    (`EpisodeRunner.take_step_counters`: environment time, re-filled tokens, per-device turns and waits)."""
    stats = list(stats)
    n = max(1, len(stats))
    out: dict[str, float | int] = {
        "episode/turns_mean": sum(s.turns for s in stats) / n,
        "episode/turns_max": max((s.turns for s in stats), default=0),
        "episode/model_tokens": sum(s.model_tokens for s in stats),
        "episode/observation_tokens": sum(s.observation_tokens for s in stats),
        "episode/env_calls": sum(s.env_calls for s in stats),
        "env_failures": sum(1 for s in stats if s.end == "env_failure"),
        "episode/tool_calls": sum(s.tool_calls for s in stats),
        "episode/tool_errors": sum(s.tool_errors for s in stats),
    }
    for end in ENDS:
        out[f"episode/end_{end}"] = sum(1 for s in stats if s.end == end)
    out.update(counters or {})
    return out


def episode_event_fields(sample: Sample, log_tokens: bool) -> dict:
    """What a `sample` event adds for an episode: its turns and model tokens (and its loss mask with
    run.log_tokens); nothing for a single answer."""
    if sample.loss_mask is None:
        return {}
    out = {"turns": sample.turn, "model_tokens": trained_tokens(sample)}
    if log_tokens:
        out["loss_mask"] = list(sample.loss_mask)
    return out
