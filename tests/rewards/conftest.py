"""Helpers of the reward tests: a user reward file in the test's tmp_path and a scorer over it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from poise.config import RewardConfig, RewardFunctionConfig
from poise.rewards.scorer import RewardInput, RewardScorer


def inputs(n: int, step: int = 0, answer: str = "1 2") -> list[RewardInput]:
    return [RewardInput((step, i, 0), f"prompt {i}", answer, {"answer": answer, "reward_kind": "items"})
            for i in range(n)]


@pytest.fixture
def reward_file(tmp_path):
    """`reward_file(source) -> path`: write a user reward module into tmp_path."""
    def write(source: str, name: str = "user_reward.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path
    return write


@pytest.fixture
def make_scorer():
    """`make_scorer(functions, **reward_cfg) -> RewardScorer`, closed after the test."""
    made: list[RewardScorer] = []

    def make(functions, **kwargs) -> RewardScorer:
        entries = tuple(RewardFunctionConfig(**f) if isinstance(f, dict) else f for f in functions)
        scorer = RewardScorer(RewardConfig(functions=entries, **kwargs))
        made.append(scorer)
        return scorer
    yield make
    for scorer in made:
        scorer.close()
